package dockerrt

import (
	"net/netip"
	"strings"
	"testing"
)

// Place's addresses are the ones the gate's configuration and the
// workload's container are given, and a bridge name fits an interface
// name whatever the sandbox's name.
func TestPlace(t *testing.T) {
	subnet := netip.MustParsePrefix("10.213.7.0/24")
	for _, name := range []string{"a", strings.Repeat("long-sandbox-name", 8)} {
		r := &Record{Name: name}
		r.Place(subnet)
		if r.Subnet != subnet || r.GateIP.String() != "10.213.7.2" || r.WorkloadIP.String() != "10.213.7.3" {
			t.Errorf("%s: subnet %s gate %s workload %s", name, r.Subnet, r.GateIP, r.WorkloadIP)
		}
		if len(r.Bridge) > 15 || !strings.HasPrefix(r.Bridge, "moat") {
			t.Errorf("%s: bridge %q, want moat... of at most 15 bytes", name, r.Bridge)
		}
	}
	a, b := &Record{Name: "a"}, &Record{Name: "b"}
	a.Place(subnet)
	b.Place(subnet)
	if a.Bridge == b.Bridge {
		t.Errorf("two sandboxes share bridge %q", a.Bridge)
	}
}
