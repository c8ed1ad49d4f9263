package kubert

import (
	"errors"
	"slices"
	"testing"

	"moat.dev/moat/internal/audit"
)

// Only records carrying the claim's UID are a claim's; no UID is nobody's.
func TestOurs(t *testing.T) {
	for _, tc := range []struct {
		rec  audit.Record
		uid  string
		want bool
	}{
		{audit.Record{ClaimUID: "u1", Claim: "c"}, "u1", true},
		{audit.Record{ClaimUID: "u2", Claim: "c"}, "u1", false},
		{audit.Record{Claim: "c", Sandbox: "s"}, "u1", false}, // a warm pod's, before the claim
		{audit.Record{}, "", false},
		{audit.Record{ClaimUID: ""}, "", false},
	} {
		if got := Ours(tc.rec, tc.uid); got != tc.want {
			t.Errorf("Ours(%+v, %q) = %v, want %v", tc.rec, tc.uid, got, tc.want)
		}
	}
}

// exec's arguments survive the trip through argv, and malformed ones are
// refused as bad usage.
func TestExecArgs(t *testing.T) {
	a := ExecArgs{Record: Record{Namespace: "ns", Claim: "c", ClaimUID: "u"}, TTY: true, Argv: []string{"sh", "-c", "echo --tty"}}
	args, err := a.args()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseExecArgs(args)
	if err != nil || got.Record != a.Record || got.TTY != a.TTY || !slices.Equal(got.Argv, a.Argv) {
		t.Errorf("ParseExecArgs(%q) = %+v, %v; want %+v", args, got, err, a)
	}
	for _, bad := range [][]string{nil, {"--record"}, {"--record", "{"}, {"--tty"}, {"--tty", "--"}, {"--what", "--", "x"}} {
		if _, err := ParseExecArgs(bad); !errors.Is(err, ErrUsage) {
			t.Errorf("ParseExecArgs(%q) = %v, want ErrUsage", bad, err)
		}
	}
}

// Each class crosses the process boundary as its exit code and comes
// back as the same sentinel, with the message alone as its text.
func TestClasses(t *testing.T) {
	for _, class := range []error{ErrUnreachable, ErrNotFound, ErrUsage} {
		err := Errorf(class, "what %d", 1)
		if err.Error() != "what 1" {
			t.Errorf("Errorf text %q, want the message alone", err.Error())
		}
		c := ExitCode(err)
		he := &HelperError{Op: "claim", Code: c, Msg: err.Error(), Class: classes[c]}
		if !errors.Is(he, class) {
			t.Errorf("%v: exit %d does not come back as itself", class, he.Code)
		}
	}
	if c := ExitCode(errors.New("other")); c != ExitError {
		t.Errorf("ExitCode(other) = %d, want %d", c, ExitError)
	}
}
