package secret

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/config"
)

// canary is a value that must never show up where it does not belong.
// It has "/" and "+" so that its escaped and base64 forms differ from it.
const canary = "sk-canary/7f3a9c1e5b2d+4068a1b2c3d4e5f60718"

// otherValue is a second secret's value.
const otherValue = "ghp_0ther0ther0ther0ther0ther0ther0th"

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// testSecrets is the configuration most tests use: API_KEY in the
// x-api-key header of api.example.com, GH_TOKEN in any header of
// github.com and its subdomains, MAPS_KEY in the key query parameter.
func testSecrets() map[string]config.Secret {
	return map[string]config.Secret{
		"API_KEY":  {Name: "API_KEY", From: "env:API_KEY", Hosts: []string{"api.example.com"}, Header: "x-api-key", Source: "/w/moat.toml"},
		"GH_TOKEN": {Name: "GH_TOKEN", From: "env:GH", Hosts: []string{"github.com", "*.github.com"}, Source: "/w/moat.toml"},
		"MAPS_KEY": {Name: "MAPS_KEY", From: "env:MAPS", Hosts: []string{"maps.example.com"}, Query: "key", Source: "/w/moat.toml"},
	}
}

func testEnv() map[string]string {
	return map[string]string{"API_KEY": canary, "GH": otherValue, "MAPS": "maps-value+with spaces&stuff"}
}

func mustResolve(t testing.TB, secrets map[string]config.Secret, e map[string]string) *Set {
	t.Helper()
	s, err := Resolve(context.Background(), secrets, env(e))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var placeholderRE = regexp.MustCompile(`^moat-ph-[a-z2-7]{32}$`)

func TestResolve(t *testing.T) {
	s := mustResolve(t, testSecrets(), testEnv())
	if got, want := s.Names(), []string{"API_KEY", "GH_TOKEN", "MAPS_KEY"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Names() = %q, want %q", got, want)
	}
	ph := s.Placeholders()
	var wantEnv []string
	for _, n := range s.Names() {
		if !placeholderRE.MatchString(ph[n]) {
			t.Errorf("placeholder of %s = %q, want moat-ph- and 32 base32 characters", n, ph[n])
		}
		wantEnv = append(wantEnv, n+"="+ph[n])
	}
	if got := s.Env(); !reflect.DeepEqual(got, wantEnv) {
		t.Errorf("Env() = %q, want %q", got, wantEnv)
	}
	if ph["API_KEY"] == ph["GH_TOKEN"] {
		t.Errorf("two secrets share placeholder %s", ph["API_KEY"])
	}
	// A new start makes new placeholders.
	again := mustResolve(t, testSecrets(), testEnv())
	if again.Placeholders()["API_KEY"] == ph["API_KEY"] {
		t.Errorf("placeholder repeated across Resolve calls")
	}
	for _, e := range s.Env() {
		if strings.Contains(e, canary) || strings.Contains(e, otherValue) {
			t.Errorf("Env() leaks a value: %s", e)
		}
	}

	empty := mustResolve(t, nil, nil)
	if empty.Env() == nil && len(empty.Names()) != 0 || empty.Scrubs() || empty.Bound("api.example.com") {
		t.Errorf("empty set: names %q, scrubs %v", empty.Names(), empty.Scrubs())
	}
	var none *Set
	if none.Bound("x.example") || none.Scrubs() || none.Env() != nil || len(none.Placeholders()) != 0 {
		t.Errorf("nil *Set is not empty")
	}
	if a, err := none.Request("x.example", nil, nil); a != nil || err != nil {
		t.Errorf("nil Request = %v, %v", a, err)
	}
}

func TestResolveWithKeepsPlaceholders(t *testing.T) {
	keep := "moat-ph-abcdefghijklmnopqrstuvwxyz234567"
	tests := []struct {
		name string
		old  map[string]string
		kept map[string]bool
	}{
		{"well formed kept", map[string]string{"API_KEY": keep}, map[string]bool{"API_KEY": true}},
		{"short replaced", map[string]string{"API_KEY": "moat-ph-abc"}, nil},
		{"empty replaced", map[string]string{"API_KEY": ""}, nil},
		{"bad alphabet replaced", map[string]string{"API_KEY": "moat-ph-ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"}, nil},
		{"foreign prefix replaced", map[string]string{"API_KEY": "xxxx-ph-abcdefghijklmnopqrstuvwxyz234567"}, nil},
		{"shared replaced for the second", map[string]string{"API_KEY": keep, "GH_TOKEN": keep}, map[string]bool{"API_KEY": true}},
		{"unknown name ignored", map[string]string{"GONE": keep}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ResolveWith(context.Background(), testSecrets(), env(testEnv()), tt.old)
			if err != nil {
				t.Fatal(err)
			}
			got := s.Placeholders()
			for n, p := range got {
				if !placeholderRE.MatchString(p) {
					t.Errorf("%s: placeholder %q is malformed", n, p)
				}
				if kept := p == tt.old[n]; kept != tt.kept[n] {
					t.Errorf("%s: kept = %v, want %v", n, kept, tt.kept[n])
				}
			}
			if got["API_KEY"] == got["GH_TOKEN"] {
				t.Errorf("placeholders shared: %v", got)
			}
		})
	}
}

// TestResolveErrors checks that each unreadable source is an error that
// names the secret and its source and says what to do, and that no
// error carries a value or a command's output.
func TestResolveErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	emptyFile := write("empty", "\n")
	bigFile := write("big", strings.Repeat("x", maxValueBytes+10))
	multiLine := write("key.pem", canary+"\n"+canary+"\n")
	old := commandTimeout
	commandTimeout = 300 * time.Millisecond
	t.Cleanup(func() { commandTimeout = old })

	sec := func(from string) map[string]config.Secret {
		return map[string]config.Secret{"GITHUB_TOKEN": {Name: "GITHUB_TOKEN", From: from, Hosts: []string{"api.github.com"}, Source: "/w/moat.toml"}}
	}
	tests := []struct {
		name   string
		from   string
		env    map[string]string
		hosts  []string
		want   string // the whole message, or a prefix ending in "…"
		leaked string // must not appear
	}{
		{"env missing", "env:GITHUB_TOKEN", nil, nil,
			"secret GITHUB_TOKEN: env:GITHUB_TOKEN is not set on the host; export GITHUB_TOKEN, or remove [secrets.GITHUB_TOKEN] from /w/moat.toml", ""},
		{"env empty", "env:GITHUB_TOKEN", map[string]string{"GITHUB_TOKEN": ""}, nil,
			"secret GITHUB_TOKEN: env:GITHUB_TOKEN gave an empty value; put the credential there, or remove [secrets.GITHUB_TOKEN] from /w/moat.toml", ""},
		{"env short", "env:GITHUB_TOKEN", map[string]string{"GITHUB_TOKEN": "hunter2"}, nil,
			"secret GITHUB_TOKEN: env:GITHUB_TOKEN gave a value of 7 bytes; moat needs at least 8…", "hunter2"},
		{"env line break", "env:GITHUB_TOKEN", map[string]string{"GITHUB_TOKEN": canary + "\r\nX-Evil: 1"}, nil,
			"secret GITHUB_TOKEN: env:GITHUB_TOKEN gave a value with a line break or NUL inside…", canary},
		{"file missing", "file:" + dir + "/nope", nil, nil,
			"secret GITHUB_TOKEN: file:" + dir + "/nope cannot be read (no such file or directory); fix the file, or remove…", ""},
		{"file empty", "file:" + emptyFile, nil, nil, "secret GITHUB_TOKEN: file:" + emptyFile + " gave an empty value…", ""},
		{"file too big", "file:" + bigFile, nil, nil, "secret GITHUB_TOKEN: file:" + bigFile + " gave a value of 65537 bytes, more than the 64 KiB…", "xxxxxxxx"},
		{"file of lines", "file:" + multiLine, nil, nil, "secret GITHUB_TOKEN: file:" + multiLine + " gave a value with a line break…", canary},
		{"command fails", "command:echo " + canary + "; echo " + canary + " >&2; exit 3", nil, nil,
			"secret GITHUB_TOKEN: command:echo " + canary + "; echo " + canary + " >&2; exit 3 failed (exit status 3; its output is not shown, since it may hold the credential); run it on the host to see why, or remove…", canary + "\n"},
		{"command empty", "command:true", nil, nil, "secret GITHUB_TOKEN: command:true gave an empty value…", ""},
		{"command too chatty", "command:yes", nil, nil, "secret GITHUB_TOKEN: command:yes printed more than the 64 KiB…", "y\ny"},
		{"command hangs", "command:printf " + canary + "; sleep 30", nil, nil,
			"secret GITHUB_TOKEN: command:printf " + canary + "; sleep 30 did not finish within 300ms…", canary + "\""},
		{"command hangs in a child", "command:(sleep 30; echo late) & wait", nil, nil,
			"secret GITHUB_TOKEN: command:(sleep 30; echo late) & wait did not finish within 300ms…", ""},
		{"bad host", "env:GITHUB_TOKEN", map[string]string{"GITHUB_TOKEN": canary}, []string{"https://api.github.com"},
			`secret GITHUB_TOKEN: hosts[0]: "https://api.github.com" is not a host name; write a name such as "api.example.com"…`, canary},
		{"bad wildcard", "env:GITHUB_TOKEN", map[string]string{"GITHUB_TOKEN": canary}, []string{"*"},
			`secret GITHUB_TOKEN: hosts[0]: "*": not allowed in a name…`, canary},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			secrets := sec(tt.from)
			if tt.hosts != nil {
				s := secrets["GITHUB_TOKEN"]
				s.Hosts = tt.hosts
				secrets["GITHUB_TOKEN"] = s
			}
			start := time.Now()
			set, err := Resolve(context.Background(), secrets, env(tt.env))
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Resolve took %s", took)
			}
			if err == nil {
				t.Fatalf("no error; set %v", set)
			}
			got := err.Error()
			if w, prefix := strings.CutSuffix(tt.want, "…"); prefix && !strings.HasPrefix(got, w) || !prefix && got != w {
				// "*" fails in NormalizeName; only the start is ours.
				if !(tt.name == "bad wildcard" && strings.HasPrefix(got, "secret GITHUB_TOKEN: hosts[0]: ")) {
					t.Errorf("error\n  %s\nwant\n  %s", got, tt.want)
				}
			}
			if tt.leaked != "" && strings.Contains(got, tt.leaked) && !strings.Contains(tt.from, tt.leaked) {
				t.Errorf("error %q carries the value", got)
			}
			if strings.Contains(fmt.Sprintf("%+v %#v", err, err), "\n"+canary) {
				t.Errorf("error formats a value")
			}
		})
	}
}

// TestResolveErrorsMatch checks the sentinel and that all failures are
// reported at once.
func TestResolveErrorsMatch(t *testing.T) {
	_, err := Resolve(context.Background(), testSecrets(), env(nil))
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("errors.Is(%v, ErrUnavailable) = false", err)
	}
	for _, n := range []string{"API_KEY", "GH_TOKEN", "MAPS_KEY"} {
		if !strings.Contains(fmt.Sprint(err), "secret "+n+":") {
			t.Errorf("error does not name %s: %v", n, err)
		}
	}
}

func TestSources(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, from string
		want       string
	}{
		{"env", "env:K", canary},
		{"file", "file:" + write("a", canary), canary},
		{"file newline", "file:" + write("b", canary+"\n"), canary},
		{"file CRLF", "file:" + write("c", canary+"\r\n"), canary},
		{"file keeps inner spaces", "file:" + write("d", " "+canary+" \n"), " " + canary + " "},
		{"command", "command:printf '%s\\n' '" + canary + "'", canary},
		{"command sees host env", "command:printf %s \"$MOAT_TEST_SECRET\"", "from-the-host-env"},
		{"command stderr ignored", "command:echo noise >&2; printf %s " + otherValue, otherValue},
		// No stdin: read fails at once instead of waiting for input.
		{"command has no stdin", "command:if read x; then echo got-input; else echo " + otherValue + "; fi", otherValue},
	}
	t.Setenv("MOAT_TEST_SECRET", "from-the-host-env")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := def{name: "K", from: tt.from}
			v, err := d.readValue(context.Background(), env(map[string]string{"K": canary}), nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(v) != tt.want {
				t.Errorf("got %q, want %q", string(v), tt.want)
			}
		})
	}
}

// TestRedaction checks that no way of printing or encoding a Set, its
// values or its snapshot shows a value.
func TestRedaction(t *testing.T) {
	s := mustResolve(t, testSecrets(), testEnv())
	snap := s.st.snap.Load()
	var outs []string
	for _, x := range []any{s, *s, snap, *snap, snap.values[0], s.st, s.st.defs, testSecrets()["API_KEY"]} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
			outs = append(outs, fmt.Sprintf(verb, x))
		}
		if b, err := json.Marshal(x); err == nil {
			outs = append(outs, string(b))
		}
	}
	b, _ := json.Marshal(struct {
		S *Set
		V value
	}{s, snap.values[0]})
	outs = append(outs, string(b))
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("x", "set", s, "val", snap.values[0])
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "set", s, "val", snap.values[0])
	outs = append(outs, logs.String())
	if got := fmt.Sprint(s); got != "[redacted]" {
		t.Errorf("fmt.Sprint(set) = %q", got)
	}
	for _, o := range outs {
		for _, v := range []string{canary, otherValue, fmt.Sprintf("%x", canary), fmt.Sprint([]byte(canary))} {
			if strings.Contains(o, v) {
				t.Errorf("output carries a value: %s", o)
			}
		}
	}
}

func TestBound(t *testing.T) {
	s := mustResolve(t, map[string]config.Secret{
		"A": {Name: "A", From: "env:A", Hosts: []string{"api.example.com", "*.Example.ORG.", "bücher.example"}},
	}, map[string]string{"A": canary})
	tests := []struct {
		host string
		want bool
	}{
		{"api.example.com", true},
		{"API.Example.COM.", true},
		{"api.example.com:443", true},
		{"example.com", false},
		{"x.api.example.com", false},
		{"apiexample.com", false},
		{"a.example.org", true},
		{"a.b.c.example.org", true},
		{"example.org", false},
		{"badexample.org", false},
		{"xn--bcher-kva.example", true},
		{"BÜCHER.example", true},
		{"10.0.0.1", false},
		{"[::1]:443", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := s.Bound(tt.host); got != tt.want {
			t.Errorf("Bound(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
}

func TestConcurrentRefresh(t *testing.T) {
	e := testEnv()
	s := mustResolve(t, testSecrets(), e)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// At most maxRetired rotations: a value swapped into a request stays scrubbed while it
		// is among the last maxRetired replaced ones; a burst of more rotations between a
		// request and its answer would retire it (a known limit, in the README).
		for i := range maxRetired {
			v := fmt.Sprintf("sk-rotated-%04d-%s", i, strings.Repeat("z", 20))
			if _, err := s.Refresh(context.Background(), env(map[string]string{"API_KEY": v, "GH": otherValue, "MAPS": "maps-value-12345"})); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	ph := s.Placeholders()["API_KEY"]
	for range 200 {
		h := map[string][]string{"X-Api-Key": {ph}}
		if _, err := s.Request("api.example.com", h, nil); err != nil {
			t.Fatal(err)
		}
		if got := s.ScrubString(h["X-Api-Key"][0]); got != ph {
			t.Fatalf("scrubbed swap = %q, want the placeholder", got)
		}
	}
	<-done
	if slices.Contains(s.Env(), "") {
		t.Error("empty env entry")
	}
}
