package cli

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"moat.dev/moat/internal/agentstate"
	"moat.dev/moat/internal/state"
)

// TestSessionProjects resolves PROJECT as a directory, a listed name, a
// name without its hash, and a sandbox's name.
func TestSessionProjects(t *testing.T) {
	root := t.TempDir()
	e := &env{dirs: state.Dirs{State: filepath.Join(root, "state"), Config: filepath.Join(root, "config"), Cache: filepath.Join(root, "cache")}}
	s := agentstate.Store{State: filepath.Join(e.dirs.State, "agentstate"), Work: filepath.Join(root, "work")}
	var wss []string
	for _, d := range []string{"a/api", "b/api", "web"} {
		ws := filepath.Join(root, "src", d)
		if err := os.MkdirAll(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Start(ws, "x", os.Getuid(), os.Getgid(), false); err != nil {
			t.Fatal(err)
		}
		// A project is listed once it keeps something.
		kept := filepath.Join(s.SandboxDir(agentstate.ProjectID(ws), "x"), "claude", "history.jsonl")
		if err := os.WriteFile(kept, []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(ws, "x"); err != nil {
			t.Fatal(err)
		}
		wss = append(wss, ws)
	}
	if err := state.Create(e.dirs.Sandbox("websb"), &state.Record{Name: "websb", Workspace: wss[2], Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	id := func(i int) string { return agentstate.ProjectID(wss[i]) }
	for _, tc := range []struct {
		arg  string
		want []string
		code int
	}{
		{arg: wss[0], want: []string{id(0)}},
		{arg: id(1), want: []string{id(1)}},
		{arg: "api", want: []string{id(0), id(1)}},
		{arg: "websb", want: []string{id(2)}},
		{arg: "nothing", code: ExitNotFound},
		{arg: filepath.Join(root, "src"), code: ExitNotFound},
	} {
		ps, err := e.sessionProjects(s, []string{tc.arg})
		if tc.code != 0 {
			if exitCode(err) != tc.code {
				t.Errorf("%s: err %v (exit %d), want exit %d", tc.arg, err, exitCode(err), tc.code)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.arg, err)
			continue
		}
		got := map[string]bool{}
		for _, p := range ps {
			got[p.ID] = true
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s: got %v, want %v", tc.arg, ps, tc.want)
		}
		for _, w := range tc.want {
			if !got[w] {
				t.Errorf("%s: got %v, want %v", tc.arg, ps, tc.want)
			}
		}
	}
}
