package kubert

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"moat.dev/moat/internal/audit"
)

// fakeKube is a moat-kube that runs script (sh) for every command.
func fakeKube(t *testing.T, script string) Helper {
	t.Helper()
	p := filepath.Join(t.TempDir(), "moat-kube")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return Helper{Path: p}
}

// exec's result comes on fd 3, apart from the command's own output and
// exit code: a command's exit code, moat-kube's classed failure, and
// moat-kube dying without a word are three different outcomes.
func TestHelperExec(t *testing.T) {
	for _, tc := range []struct {
		what, script string
		code         int
		class        error // nil: no error
		noResult     bool
	}{
		{"the command's code", `echo out; echo err >&2; echo '{"schema":1,"exit_code":7}' >&3; exit 7`, 7, nil, false},
		{"a classed failure", `echo '{"schema":1,"error":"SandboxClaim c is gone","code":4}' >&3; exit 4`, 0, ErrNotFound, false},
		{"no result", `kill -9 $$`, 0, nil, true},
	} {
		h := fakeKube(t, tc.script)
		var out, errb bytes.Buffer
		code, err := h.Exec(context.Background(), ExecArgs{Record: Record{Claim: "c", ClaimUID: "u"}, Argv: []string{"x"}}, strings.NewReader(""), &out, &errb)
		switch {
		case tc.noResult:
			if err == nil || !strings.Contains(err.Error(), "without a result") {
				t.Errorf("%s: %d, %v; want an error saying there was no result", tc.what, code, err)
			}
		case tc.class != nil:
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), "gone") {
				t.Errorf("%s: %v; want %v with moat-kube's message", tc.what, err, tc.class)
			}
		default:
			if err != nil || code != tc.code || out.String() != "out\n" || errb.String() != "err\n" {
				t.Errorf("%s: %d, %v, stdout %q, stderr %q", tc.what, code, err, out.String(), errb.String())
			}
		}
	}
}

// The other commands: their error lines become the error, with the
// class of the exit code; other stderr lines go to the user.
func TestHelperRun(t *testing.T) {
	var warn bytes.Buffer
	h := fakeKube(t, `echo 'waiting for the pod' >&2; echo 'moat-kube: --template t: no such template' >&2; exit 4`)
	h.Stderr = &warn
	_, err := h.Claim(context.Background(), ClaimRequest{Template: "t"})
	if !errors.Is(err, ErrNotFound) || err.Error() != "--template t: no such template" || warn.String() != "waiting for the pod\n" {
		t.Errorf("Claim: %v (stderr passed on %q); want ErrNotFound with moat-kube's message, the other line passed on", err, warn.String())
	}
	h = fakeKube(t, `cat >/dev/null; echo '{"schema":1,"namespace":"ns","claim":"moat-a-x","claim_uid":"u"}'`)
	r, err := h.Claim(context.Background(), ClaimRequest{Template: "t"})
	if err != nil || r.Claim != "moat-a-x" || r.ClaimUID != "u" {
		t.Errorf("Claim = %+v, %v", r, err)
	}
}

// moat keeps only the claim's records of what moat-kube sends, should
// moat-kube's own filter ever let another through.
func TestHelperAuditFilters(t *testing.T) {
	h := fakeKube(t, `cat >/dev/null
echo '{"verdict":"deny","claim":"a","claim_uid":"ua","name":"ours.example"}'
echo '{"verdict":"deny","claim":"b","claim_uid":"ub","name":"theirs.example"}'
echo '{"verdict":"allow","name":"nobody.example"}'`)
	var got []string
	err := h.Audit(context.Background(), AuditRequest{Record: Record{Claim: "a", ClaimUID: "ua"}}, func(r audit.Record) { got = append(got, r.Name) })
	if err != nil || len(got) != 1 || got[0] != "ours.example" {
		t.Errorf("Audit delivered %q, %v; want ours.example alone", got, err)
	}
}
