package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// loopbackDNS answers A questions for names from a map, on 127.0.0.1: the
// gate's upstream resolver for a test that needs no test internet. Every
// other question gets NXDOMAIN.
func loopbackDNS(t *testing.T, answers map[string]string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Rcode = dns.RcodeNameError
		if len(q.Question) == 1 {
			qn := strings.ToLower(q.Question[0].Name)
			if ip, ok := answers[qn]; ok {
				m.Rcode = dns.RcodeSuccess
				if q.Question[0].Qtype == dns.TypeA {
					m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: qn, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(ip)})
				}
			}
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// TestPolicyLists: named policies end to end. A policy whose list is a
// file in the workspace (a hosts line and an Adblock line, and a line it
// rejects) denies the list's names through the real gate, while a name
// another named policy allows still resolves; a policy whose source is
// unreachable and was never fetched leaves the sandbox running with that
// layer empty, and `moat status` says so.
func TestPolicyLists(t *testing.T) {
	upstream := loopbackDNS(t, map[string]string{
		"ok.pol.test.": "192.0.2.7", "ads.pol.test.": "192.0.2.8", "x.trk.pol.test.": "192.0.2.9",
	})
	// A source nobody answers: a loopback port bound, then closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/blocklist.txt"
	ln.Close()

	name := "policy-lists"
	dir := project(t, name)
	list := "# a test blocklist\n0.0.0.0 ads.pol.test\n||trk.pol.test^\nnot a valid line!\n"
	if err := os.WriteFile(filepath.Join(dir, "blocklist.txt"), []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	toml := `[network]
use = ["base", "ads", "far"]

[policies.base]
allow = ["*.pol.test"]

[policies.ads]
source = "blocklist.txt"

[policies.far]
source = "` + dead + `"
`
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"MOAT_UPSTREAM_DNS=" + upstream}
	mustMoatEnv(t, dir, env, "up")

	// The list's names get pool addresses (never asked upstream), the
	// positive control its real one; a connection to a listed name is
	// refused at once.
	script := `for n in ok.pol.test ads.pol.test x.trk.pol.test; do echo "$n $(timeout 5 getent hosts $n | cut -d' ' -f1)"; done
if timeout 5 bash -c "echo > /dev/tcp/ads.pol.test/22" 2>/dev/null; then echo "OPEN ads"; else echo "closed ads"; fi`
	out := mustMoatEnv(t, dir, env, "run", "--", "bash", "-c", script)
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 {
			got[f[0]] = f[1]
		}
	}
	if got["ok.pol.test"] != "192.0.2.7" {
		t.Errorf("ok.pol.test (allowed by policy base) resolved to %q, want 192.0.2.7\n%s", got["ok.pol.test"], out)
	}
	for _, n := range []string{"ads.pol.test", "x.trk.pol.test"} {
		if !inPool(got[n]) {
			t.Errorf("%s (in the list) resolved to %q, want a pool address: it reached upstream\n%s", n, got[n], out)
		}
	}
	if got["closed"] != "ads" {
		t.Errorf("a connection to a listed name was not refused:\n%s", out)
	}

	// The audit log names the list's rules as the deciders.
	g := &gateEnv{state: filepath.Join(moatHome, "state", "sandboxes", name)}
	want := map[string]string{"ads.pol.test": "ads.pol.test", "x.trk.pol.test": "*.trk.pol.test"}
	deadline := time.Now().Add(auditWait)
	for len(want) > 0 && time.Now().Before(deadline) {
		for _, r := range g.audit(t) {
			if rule, ok := want[r.Name]; ok && r.Verdict == "deny" && r.Layer == "policy" && r.Rule == rule {
				delete(want, r.Name)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(want) > 0 {
		t.Errorf("no denial by the list's rule in the audit log for %v", want)
	}

	// moat status: running, with the never-fetched list's warning and
	// the rejected line's.
	st := mustMoat(t, dir, "status")
	for _, w := range []string{"state:      running", `policy "far"`, "never been fetched", "EMPTY", `policy "ads"`, "1 of 4 lines", "line 4"} {
		if !strings.Contains(st, w) {
			t.Errorf("moat status lacks %q:\n%s", w, st)
		}
	}
	var sj struct {
		State    string   `json:"state"`
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal([]byte(mustMoat(t, dir, "status", "--json")), &sj); err != nil || sj.State != "running" || len(sj.Warnings) != 2 {
		t.Errorf("status --json: %+v (%v)", sj, err)
	}

	// moat policy list and show tell the same story.
	pl := mustMoat(t, dir, "policy", "list")
	for _, w := range []string{"base", "ads", "far", "never", "never been fetched"} {
		if !strings.Contains(pl, w) {
			t.Errorf("moat policy list lacks %q:\n%s", w, pl)
		}
	}
	ps := mustMoat(t, dir, "policy", "show", "ads")
	for _, w := range []string{"block ads.pol.test policy policy ads", "block *.trk.pol.test policy", "1 rejected lines:", "line 4:"} {
		if !strings.Contains(strings.Join(strings.Fields(ps), " "), w) {
			t.Errorf("moat policy show ads lacks %q:\n%s", w, ps)
		}
	}
}

// TestPolicyRefreshLive: a list served over HTTP (a loopback server) is
// fetched at start; after it changes, `moat policy refresh` fetches it
// again and the running sandbox's gate applies the new list at once.
func TestPolicyRefreshLive(t *testing.T) {
	upstream := loopbackDNS(t, map[string]string{"one.pol.test.": "192.0.2.11", "two.pol.test.": "192.0.2.12"})
	var body atomic.Value
	body.Store("0.0.0.0 one.pol.test\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := body.Load().(string)
		etag := fmt.Sprintf(`"%x"`, sha256.Sum256([]byte(b)))
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", etag)
		io.WriteString(w, b)
	}))
	defer srv.Close()

	dir := project(t, "policy-live")
	toml := "[network]\nuse = [\"base\", \"ads\"]\n\n[policies.base]\nallow = [\"*.pol.test\"]\n\n[policies.ads]\nsource = \"" + srv.URL + "/hosts\"\n"
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"MOAT_UPSTREAM_DNS=" + upstream}
	mustMoatEnv(t, dir, env, "up")
	resolve := func() (one, two string) {
		out := mustMoatEnv(t, dir, env, "run", "--", "sh", "-c", "for n in one.pol.test two.pol.test; do echo $(timeout 5 getent hosts $n | cut -d' ' -f1); done")
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("resolving in the guest: %q", out)
		}
		return f[0], f[1]
	}
	if one, two := resolve(); !inPool(one) || two != "192.0.2.12" {
		t.Fatalf("with the first list: one.pol.test %s (want a pool address), two.pol.test %s (want 192.0.2.12)", one, two)
	}
	body.Store("0.0.0.0 two.pol.test\n")
	if r := moat(t, dir, nil, "policy", "refresh", "ads"); r.code != 0 || !strings.Contains(r.stderr, "fetched") {
		t.Fatalf("policy refresh: exit %d\n%s", r.code, r.stderr)
	}
	if one, two := resolve(); one != "192.0.2.11" || !inPool(two) {
		t.Fatalf("after the refresh: one.pol.test %s (want 192.0.2.11), two.pol.test %s (want a pool address)", one, two)
	}
	if r := moat(t, dir, nil, "policy", "refresh", "ads"); r.code != 0 || !strings.Contains(r.stderr, "not modified") {
		t.Fatalf("a second refresh should be a 304: exit %d\n%s", r.code, r.stderr)
	}
	mustMoat(t, dir, "policy", "rm", "ads")
	if pl := mustMoat(t, dir, "policy", "list"); !strings.Contains(pl, "never been fetched") {
		t.Fatalf("after rm, policy list:\n%s", pl)
	}
}
