package cli

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/state"
)

// posted is what the stand-in daemon saw of one answer, and what the
// scope's file held at that moment.
type posted struct {
	id     string
	answer control.Answer
	file   string // the written file's bytes when the answer arrived
}

// fakeDaemon serves POST /v1/holds/{id} on the sandbox's control socket,
// answering status (200, or an error), and keeps every answer.
func fakeDaemon(t *testing.T, dir string, status int) *[]posted {
	t.Helper()
	var mu sync.Mutex
	got := &[]posted{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/holds/{id}", func(w http.ResponseWriter, r *http.Request) {
		var a control.Answer
		json.NewDecoder(r.Body).Decode(&a)
		p := posted{id: r.PathValue("id"), answer: a}
		if a.Written != "" {
			b, _ := os.ReadFile(a.Written)
			p.file = string(b)
		}
		mu.Lock()
		*got = append(*got, p)
		mu.Unlock()
		w.WriteHeader(status)
		if status != http.StatusOK {
			json.NewEncoder(w).Encode(control.ErrorBody{Schema: control.Schema, Error: "hold h1 is no longer pending"})
			return
		}
		json.NewEncoder(w).Encode(control.AnswerResult{Schema: control.Schema, Rule: "from the daemon", File: a.Written})
	})
	l, err := net.Listen("unix", control.Socket(dir))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return got
}

// TestWatchAnswerWritesTheFile: moat network watch itself writes an
// "always" or "block" answer's rule into the scope's file before it tells
// the daemon, and names that file in the answer; when the daemon does not
// take the answer, the error says the file was written and how to apply
// the rule now. Errors before the write send nothing.
func TestWatchAnswerWritesTheFile(t *testing.T) {
	hold := control.Hold{ID: "h1", Sandbox: "api", Name: "x.tracker.example", Port: 443,
		Suggest: "x.tracker.example", Domain: "tracker.example"}
	for _, tt := range []struct {
		name      string
		noWS      bool // the record has no workspace
		answer    string
		scope     string
		status    int
		wantFile  string // "project" or "user": the file that must hold the rule
		wantRule  string // in that file
		wantErr   string // "" for success
		wantPosts int
	}{
		{"always, project", false, control.AnswerAlways, control.ScopeProject, 200, "project", `allow = ["x.tracker.example"]`, "", 1},
		{"block, user", false, control.AnswerBlock, control.ScopeUser, 200, "user", `block = ["tracker.example", "*.tracker.example"]`, "", 1},
		{"always, hold gone", false, control.AnswerAlways, control.ScopeProject, 404, "project", `allow = ["x.tracker.example"]`,
			"but the sandbox did not take it live (daemon /v1/holds/h1: hold h1 is no longer pending); to apply it now: moat network allow api x.tracker.example", 1},
		{"block, hold gone", false, control.AnswerBlock, control.ScopeUser, 404, "user", `block = ["tracker.example", "*.tracker.example"]`,
			"moat network block api tracker.example '*.tracker.example'", 1},
		{"project without a workspace", true, control.AnswerAlways, control.ScopeProject, 200, "", "",
			"this sandbox has no workspace to write moat.toml into; answer with scope user", 0},
		{"once writes nothing", false, control.AnswerOnce, "", 200, "", "", "", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			home := t.TempDir()
			e := &env{dirs: state.Dirs{Config: filepath.Join(home, "config"), State: filepath.Join(home, "state")}}
			ws := t.TempDir()
			rec := &state.Record{Name: "api", Workspace: ws}
			if tt.noWS {
				rec.Workspace = ""
			}
			dir := e.dirs.Sandbox("api")
			if err := state.Create(dir, rec); err != nil {
				t.Fatal(err)
			}
			posts := fakeDaemon(t, dir, tt.status)
			set := &watchSet{e: e}

			res, err := set.answer(hold, control.Answer{Answer: tt.answer, Scope: tt.scope})
			if tt.wantErr == "" && err != nil {
				t.Fatalf("answer: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("answer: %v, want an error with %q", err, tt.wantErr)
			}
			if len(*posts) != tt.wantPosts {
				t.Fatalf("%d answers posted, want %d: %+v", len(*posts), tt.wantPosts, *posts)
			}
			files := map[string]string{"project": filepath.Join(ws, "moat.toml"), "user": e.dirs.UserConfig()}
			for scope, f := range files {
				b, err := os.ReadFile(f)
				if scope != tt.wantFile {
					if !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s was written: %q", f, b)
					}
					continue
				}
				if !strings.Contains(string(b), tt.wantRule) {
					t.Errorf("%s holds %q, want %s", f, b, tt.wantRule)
				}
			}
			if tt.wantFile == "" || tt.wantPosts == 0 {
				return
			}
			p := (*posts)[0]
			want := files[tt.wantFile]
			if p.id != "h1" || p.answer.Written != want {
				t.Errorf("posted %+v, want hold h1 written to %s", p, want)
			}
			// Written before it was posted: the daemon could already read the rule.
			if !strings.Contains(p.file, tt.wantRule) {
				t.Errorf("when the answer was posted, %s held %q: not yet written", want, p.file)
			}
			if tt.wantErr == "" && (res == nil || res.File != want) {
				t.Errorf("result %+v, want the file %s", res, want)
			}
		})
	}
}
