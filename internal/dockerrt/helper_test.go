package dockerrt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/guestspec"
)

// fakeHelper is a moat-docker that answers every command with out on
// stdout, lines on stderr and exit code, and keeps its arguments and
// stdin in dir: the other end of the protocol, at the edge, so that
// Helper's side is tested as it runs.
func fakeHelper(t *testing.T, out, stderr string, code int) (string, string) {
	t.Helper()
	dir := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\necho \"$@\" > %[1]s/args\ncat > %[1]s/stdin\nprintf '%%s' '%[2]s'\nprintf '%%s' '%[3]s' >&2\nexit %[4]d\n", dir, out, stderr, code)
	p := filepath.Join(dir, "moat-docker")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p, dir
}

func TestHelperExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   int
		stderr string
		is     error
		msg    string
		warned string
	}{
		{"no record", ExitNoRecord, "moat-docker: no docker record\n", ErrNoRecord, "no docker record", ""},
		{"unreachable", ExitUnreachable, "moat-docker: the Docker engine is not reachable at unix:///x: refused\n", ErrUnreachable, "the Docker engine is not reachable at unix:///x: refused", ""},
		{"no image", ExitNoImage, "moat-docker: docker has no such image: \"x\"\n", ErrNoImage, "docker has no such image: \"x\"", ""},
		{"warning then joined error", ExitError, "moat: a warning\nmoat-docker: first\nmoat-docker: second\n", nil, "first\nsecond", "moat: a warning\n"},
		{"a panic", 2, "panic: boom\n", nil, "moat-docker stop failed (exit status 2) and said nothing on stderr; what it printed is above", "panic: boom\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := fakeHelper(t, "", tc.stderr, tc.code)
			var warn bytes.Buffer
			err := Helper{Path: p, Stderr: &warn}.Stop(context.Background(), "/state/x")
			var he *HelperError
			if !errors.As(err, &he) || he.Code != tc.code {
				t.Fatalf("err = %v, want a HelperError with code %d", err, tc.code)
			}
			if err.Error() != tc.msg {
				t.Errorf("message = %q, want %q", err.Error(), tc.msg)
			}
			for _, s := range []error{ErrNoRecord, ErrUnreachable, ErrNoImage} {
				if got, want := errors.Is(err, s), s == tc.is; got != want {
					t.Errorf("errors.Is(err, %v) = %v, want %v", s, got, want)
				}
			}
			if warn.String() != tc.warned {
				t.Errorf("passed on %q, want %q", warn.String(), tc.warned)
			}
		})
	}
}

// An error's class survives the round trip: moat-docker's exit code for
// it names the sentinel moat matches, read as Helper reads any exit.
func TestExitCodeRoundTrip(t *testing.T) {
	for _, s := range []error{ErrNoRecord, ErrUnreachable, ErrNotLocal, ErrNoImage, errors.New("other")} {
		p, _ := fakeHelper(t, "", ErrorPrefix+"doing it\n", ExitCode(fmt.Errorf("doing it: %w", s)))
		var he *HelperError
		if err := (Helper{Path: p}).Stop(context.Background(), "/state/x"); !errors.As(err, &he) {
			t.Fatalf("%v: err = %v, want a HelperError", s, err)
		}
		want := s
		if s == ErrNotLocal {
			want = ErrUnreachable // one class: the engine is not one moat can use
		}
		if s.Error() == "other" {
			if he.Code != ExitError || he.Unwrap() != nil {
				t.Errorf("other error: code %d, class %v", he.Code, he.Unwrap())
			}
			continue
		}
		if !errors.Is(he, want) {
			t.Errorf("%v: code %d does not come back as %v", s, he.Code, want)
		}
	}
}

func TestHelperUp(t *testing.T) {
	rec := Record{Schema: Schema, Name: "api", Image: "busybox", ImageID: "sha256:ab", Runtime: "runc",
		Subnet: netip.MustParsePrefix("10.213.0.0/24"), GateIP: netip.MustParseAddr("10.213.0.2"), WorkloadIP: netip.MustParseAddr("10.213.0.3")}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	p, dir := fakeHelper(t, string(b), "moat: sandbox \"api\" runs on Docker with runc\n", 0)
	var warn bytes.Buffer
	o := Options{Dir: "/state/api", Moat: "/bin/moat", Gate: "/bin/moat-gate", Guest: &guestspec.Spec{Hostname: "api"},
		Upstream: []netip.AddrPort{netip.MustParseAddrPort("198.51.100.1:53")}, Warn: &warn}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := Helper{Path: p, Stderr: &warn}.Up(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if *got != rec {
		t.Errorf("record = %+v, want %+v", *got, rec)
	}
	if !strings.Contains(warn.String(), "runs on Docker with runc") {
		t.Errorf("the warning was not passed on: %q", warn.String())
	}
	args, _ := os.ReadFile(filepath.Join(dir, "args"))
	if strings.TrimSpace(string(args)) != "up" {
		t.Errorf("args = %q, want up", args)
	}
	var sent Options
	stdin, _ := os.ReadFile(filepath.Join(dir, "stdin"))
	if err := json.Unmarshal(stdin, &sent); err != nil {
		t.Fatalf("stdin %q: %v", stdin, err)
	}
	if sent.Schema != Schema || sent.Gate != o.Gate || sent.Guest.Hostname != "api" || len(sent.Upstream) != 1 {
		t.Errorf("sent %+v", sent)
	}
}

func TestHelperMissing(t *testing.T) {
	_, err := Helper{Path: filepath.Join(t.TempDir(), "moat-docker")}.Info(context.Background())
	if err == nil || !strings.Contains(err.Error(), "moat-docker") {
		t.Errorf("err = %v, want one naming moat-docker", err)
	}
}

// moat's environment holds env: secrets' values: moat-docker gets only
// what the Docker client and its basics read.
func TestHelperEnv(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "moat-docker")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nenv > "+dir+"/env\necho '{}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOAT_HELPER_CANARY", "canary-value-0123456789")
	t.Setenv("DOCKER_HOST", "unix:///run/docker.sock")
	if err := (Helper{Path: p}).Stop(context.Background(), "/state/x"); err != nil {
		t.Fatal(err)
	}
	env, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(env), "canary-value") || !strings.Contains(string(env), "DOCKER_HOST=unix:///run/docker.sock") || !strings.Contains(string(env), "PATH=") {
		t.Errorf("moat-docker's environment:\n%s\nwant DOCKER_HOST and PATH, and not MOAT_HELPER_CANARY", env)
	}
}
