package gate

import (
	"strings"
	"testing"
	"time"
)

// TestMaxConnectionsRefusesBeyondTheLimit: connections the gate holds
// open (here waiting for a request head) count against the sandbox's
// limit; one beyond it is refused at once with an audit line that names
// the setting, and a slot freed is usable again.
func TestMaxConnectionsRefusesBeyondTheLimit(t *testing.T) {
	f := newFixture(t, nil, nil, nil)
	f.g.o.MaxConnections = 2
	var held []*flowResult
	for range 2 {
		r := f.flow(t, "198.51.100.66:80")
		if !r.accepted {
			t.Fatalf("a connection within the limit was not accepted (refused %v)", r.refused)
		}
		held = append(held, r)
	}
	over := f.flow(t, "198.51.100.66:80")
	if !over.refused || over.accepted {
		t.Fatalf("the connection beyond the limit of 2: refused %v, accepted %v; want refused", over.refused, over.accepted)
	}
	held[0].guest.Close()
	select {
	case <-held[0].done:
	case <-time.After(5 * time.Second):
		t.Fatal("the gate did not end a flow whose guest closed")
	}
	again := f.flow(t, "198.51.100.66:80")
	if !again.accepted {
		t.Fatalf("after a connection ended, a new one was refused: the slot was not given back")
	}
	again.guest.Close()
	held[1].guest.Close()
	<-again.done
	<-held[1].done
	var found bool
	for _, r := range f.records(t) {
		if r.Verdict == "deny" && strings.Contains(string(r.Reason), "max_connections") {
			if !strings.Contains(string(r.Reason), "2") {
				t.Errorf("the refusal's reason %q does not say the limit", r.Reason)
			}
			found = true
		}
	}
	if !found {
		t.Errorf("no audit record of the refused connection names max_connections")
	}
}
