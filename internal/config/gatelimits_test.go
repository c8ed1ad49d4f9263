package config

import (
	"strings"
	"testing"
)

// TestGateLimits: [network] max_connections, max_dns_queries and max_holds
// take whole numbers of at least 1, a narrower file's value wins, and a
// bad one is an error that names the key and its line.
func TestGateLimits(t *testing.T) {
	user := mustParse(t, "/home/u/.config/moat/config.toml", "[network]\nmax_connections = 100\nmax_holds = 4\n")
	proj := mustParse(t, "/work/proj/moat.toml", "[network]\nmax_connections = 300\nmax_dns_queries = 32\n")
	c := Merge(user, proj)
	if got, want := [3]int{c.Network.MaxConnections, c.Network.MaxDNSQueries, c.Network.MaxHolds}, [3]int{300, 32, 4}; got != want {
		t.Errorf("merged (max_connections, max_dns_queries, max_holds) = %v, want %v", got, want)
	}
	if c := Merge(mustParse(t, "/work/proj/moat.toml", "[network]\nallow = [\"a.test\"]\n")); c.Network.MaxConnections != 0 {
		t.Errorf("unset max_connections = %d, want 0 (derived by the daemon)", c.Network.MaxConnections)
	}
	for _, c := range []struct{ doc, want string }{
		{"[network]\nmax_connections = 0\n", "network.max_connections"},
		{"[network]\nmax_dns_queries = -3\n", "network.max_dns_queries"},
		{"[network]\nmax_holds = \"many\"\n", "network.max_holds"},
		{"[network]\nmax_connection = 10\n", "max_connection"},
	} {
		_, err := parse(t, c.doc)
		if err == nil {
			t.Errorf("%q parsed; want an error naming %s", c.doc, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), ":2") {
			t.Errorf("%q: error %q does not name %s at line 2", c.doc, err, c.want)
		}
	}
}
