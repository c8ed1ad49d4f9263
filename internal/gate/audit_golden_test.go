package gate

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// goldenNow is every record's time in the golden files. The gate runs on
// the real clock (its read deadlines are taken from it), so the records'
// times and durations are set to these fixed values before they are
// compared.
var goldenNow = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)

// goldenUpstream is the plain-HTTP upstream of the golden test, at a
// fixed loopback address so that it is the same in every run (the other
// gate tests take random ones in 127.100/9 and up, never this one).
const goldenUpstream = "127.77.0.1"

// goldenRecords collects what the gate writes to its audit log, in order.
type goldenRecords struct {
	mu    sync.Mutex
	names []string
	recs  []audit.Record
	seen  int
}

func (gr *goldenRecords) add(r audit.Record) {
	gr.mu.Lock()
	gr.recs = append(gr.recs, r)
	gr.mu.Unlock()
}

// marshal is the records' JSON, one per line after its name.
func (gr *goldenRecords) marshal(t *testing.T) []byte {
	t.Helper()
	gr.mu.Lock()
	defer gr.mu.Unlock()
	var out bytes.Buffer
	for i, r := range gr.recs {
		name := "unnamed"
		if i < len(gr.names) {
			name = gr.names[i]
		}
		r.Time, r.DurationMS = goldenNow, 0
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out.WriteString(name + " " + string(b) + "\n")
	}
	return out.Bytes()
}

// take names the records written since the last take.
func (gr *goldenRecords) take(name string) {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	for ; gr.seen < len(gr.recs); gr.seen++ {
		gr.names = append(gr.names, name)
	}
}

// TestAuditRecordsGolden writes one record of each kind the gate writes,
// through the gate's own paths, and compares their JSON to
// testdata/audit_records.golden byte for byte: the audit's JSON is frozen,
// so a renamed field or a reworded reason shows up here first. Run with
// -update to rewrite the file after a deliberate addition.
func TestAuditRecordsGolden(t *testing.T) {
	up := listenAt(t, goldenUpstream+":80")
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				http.ReadRequest(bufio.NewReader(c))
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			}()
		}
	}()
	u := startDNS(t, map[string]string{
		"allowed.test": goldenUpstream, "held.test": goldenUpstream, "report.test": goldenUpstream,
		"rebind.test": "10.9.9.9", "public.test": "192.0.2.10", "pre.test": "192.0.2.20",
	})
	allow, err := policy.FromEntries([]string{"allowed.test", "rebind.test", "public.test", "pre.test", goldenUpstream}, policy.Allow, policy.LayerProject, "moat.toml")
	if err != nil {
		t.Fatal(err)
	}
	block, err := policy.FromEntries([]string{"blocked.test"}, policy.Block, policy.LayerUser, "config.toml")
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(t.TempDir(), "audit.jsonl"), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	gr := &goldenRecords{}
	al.Tap(gr.add)
	timers := &manualTimers{now: goldenNow, fns: map[int]func(){}}
	holds := NewHolds(HoldsOptions{Now: timers.Now, AfterFunc: timers.AfterFunc, Max: 1})
	g := New(Options{
		Sandbox:     "sb",
		Policy:      policy.Compile(append(allow, block...)),
		Resolver:    NewResolver(ResolverOptions{Servers: []netip.AddrPort{u.addr}}),
		Audit:       al,
		PeekTimeout: 2 * time.Second,
		DialTimeout: 2 * time.Second,
		Holds:       holds,
	})
	g.flowPrefix = "golden"

	get := func(host string) func(net.Conn) {
		return func(c net.Conn) { io.WriteString(c, "GET /x HTTP/1.1\r\nHost: "+host+"\r\n\r\n") }
	}
	send := func(s string) func(net.Conn) { return func(c net.Conn) { io.WriteString(c, s) } }
	hello := func(sni string) func(net.Conn) {
		return func(c net.Conn) {
			tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
			tc.Handshake()
		}
	}

	// DNS: an allowed name's answer, a denied name's pool answer, a
	// query that is not one.
	dnsQuery(t, g, "allowed.test", dns.TypeA)
	gr.take("dns-allow")
	pooled := answerAddrs(unpack(t, dnsQuery(t, g, "denied.test", dns.TypeA)))
	gr.take("dns-pool")
	if len(pooled) != 1 {
		t.Fatalf("denied.test: answered %v, want one pool address", pooled)
	}
	g.DNS().Handle(context.Background(), []byte{1, 2, 3}, false)
	gr.take("dns-malformed")

	// A carried connection: its start and its end.
	goldenFlow(t, g, "198.51.100.66:80", get("allowed.test"))
	gr.take("allow-host")
	// Denials, one of each reason the gate gives.
	goldenFlow(t, g, "198.51.100.66:80", get("denied.test"))
	gr.take("deny-no-rule")
	goldenFlow(t, g, "198.51.100.66:80", get("blocked.test"))
	gr.take("deny-blocked")
	goldenFlow(t, g, "10.1.2.3:22", nil)
	gr.take("deny-class-private")
	goldenFlow(t, g, "127.0.0.1:5432", nil)
	gr.take("deny-class-loopback")
	goldenFlow(t, g, "198.18.255.250:22", nil)
	gr.take("deny-pool-unbound")
	goldenFlow(t, g, "198.51.100.7:22", nil)
	gr.take("deny-address-no-rule")
	goldenFlow(t, g, netip.AddrPortFrom(pooled[0], 22).String(), nil)
	gr.take("deny-pool-name")
	goldenFlow(t, g, "198.51.100.7:443", hello(""))
	gr.take("deny-no-sni")
	goldenFlow(t, g, "198.18.255.251:443", hello(""))
	gr.take("deny-no-sni-pool")
	goldenFlow(t, g, "198.51.100.7:443", send("\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00"))
	gr.take("deny-malformed-hello")
	goldenFlow(t, g, "198.51.100.7:80", send("GET /\r\n\r\n"))
	gr.take("deny-bad-head")
	goldenFlow(t, g, "198.51.100.7:80", send("CONNECT x.test:443 HTTP/1.1\r\nHost: x.test:443\r\n\r\n"))
	gr.take("deny-connect")
	goldenFlow(t, g, "198.51.100.7:80", get("192.0.2.1"))
	gr.take("deny-host-address-mismatch")
	goldenFlow(t, g, "198.51.100.7:80", get("198.51.100.7"))
	gr.take("deny-host-address-no-rule")
	goldenFlow(t, g, "198.51.100.7:80", send("GET / HTTP/1.1\r\n\r\n"))
	gr.take("deny-no-host")
	goldenFlow(t, g, "198.51.100.66:80", get("rebind.test"))
	gr.take("deny-rebind-to-class")
	g.overCap(netip.MustParseAddrPort("198.51.100.8:443"))
	gr.take("deny-max-connections")
	g.audit(g.denyRecord("tcp", netip.MustParseAddrPort("198.51.100.9:443"), unrecordedReason(errors.New("no space left on device"))))
	gr.take("deny-unrecorded")
	g.DenyDatagram(netip.MustParseAddrPort("192.0.2.53:53"), "DNS to a resolver other than the gateway")
	gr.take("deny-udp")
	g.Echo(netip.MustParseAddr("198.51.100.10"))
	gr.take("deny-icmp")
	g.Echo(netip.MustParseAddr("10.0.0.1"))
	gr.take("deny-icmp-class")
	dnsQuery(t, g, "public.test", dns.TypeA)
	gr.take("dns-allow-public")
	g.Echo(netip.MustParseAddr("192.0.2.10"))
	gr.take("allow-icmp-observed")
	g.Preresolve(context.Background())
	g.Echo(netip.MustParseAddr("192.0.2.20"))
	gr.take("allow-icmp-resolved")
	g.Bindings().Add("granted.test", []netip.Addr{netip.MustParseAddr("192.0.2.30")}, SourceGranted, time.Now().Add(time.Hour))
	g.Echo(netip.MustParseAddr("192.0.2.30"))
	gr.take("deny-icmp-granted")

	// Report mode lets a denial through, audited would_deny.
	g.SetReport(true)
	goldenFlow(t, g, "198.51.100.66:80", get("report.test"))
	g.SetReport(false)
	gr.take("would-deny")

	// Holds, each way one ends. Every hold of the test is held.test:80.
	pending := make(chan Pending, 4)
	_, detach := holds.Watch(func(e HoldEvent) {
		if e.Kind == "hold" {
			pending <- e.Pending
		}
	})
	answer := func(out Outcome) func(Pending) {
		return func(p Pending) {
			if _, ok := holds.Take(p.ID); !ok {
				t.Errorf("hold %s is not pending", p.ID)
			}
			holds.Finish(p.ID, out)
		}
	}
	heldFlow := func(name string, end func(Pending)) {
		done := make(chan struct{})
		go func() { defer close(done); goldenFlow(t, g, "198.51.100.66:80", get("held.test")) }()
		select {
		case p := <-pending:
			end(p)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: nothing was held within 5 s", name)
		}
		<-done
		gr.take(name)
	}
	heldFlow("hold-once", answer(Outcome{Allow: true, Answer: "once", By: "watcher"}))
	heldFlow("hold-deny", answer(Outcome{Answer: "deny", By: "watcher"}))
	heldFlow("hold-timeout", func(Pending) { timers.fire() })
	heldFlow("hold-run", func(p Pending) {
		// The one place (Max 1) is taken: another destination is
		// refused at once.
		goldenFlow(t, g, "198.51.100.66:80", get("denied.test"))
		gr.take("hold-overflow")
		answer(Outcome{Allow: true, Answer: "run", By: "watcher"})(p)
	})
	heldFlow("hold-closed", func(Pending) { detach() })
	holds.OpenUntil(goldenNow.Add(time.Hour))
	goldenFlow(t, g, "198.51.100.66:80", get("held.test"))
	gr.take("hold-hour")
	holds.OpenUntil(time.Time{})

	compareGolden(t, filepath.Join("testdata", "audit_records.golden"), gr.marshal(t))
}

// TestAuditRecordsGoldenIntercepted is TestAuditRecordsGolden for what the
// gate writes when it terminates TLS: a request carrying a secret, a
// fronted request, a secret's host reached in the clear. The upstream's
// random loopback address is written as UPSTREAM, and the byte counts of
// the TLS connections (which vary with the handshake) as 0.
func TestAuditRecordsGoldenIntercepted(t *testing.T) {
	creds := testSecrets(t, false)
	ph := creds.Placeholders()["API_KEY"]
	f := newMITMFixture(t, []string{"api.test", "other.test"}, func(o *Options) {
		o.Credentials = creds
	})
	f.g.flowPrefix = "golden"
	gr := &goldenRecords{}
	f.log.Tap(gr.add)
	c := f.client(t, false, f.roots)
	req, _ := http.NewRequest("GET", "https://api.test/echo?q=1", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	req.Header.Set("Connection", "close")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	f.done(t, c)
	gr.take("intercepted-secret")

	req, _ = http.NewRequest("GET", "https://api.test/echo", nil)
	req.Host = "other.test"
	req.Header.Set("Connection", "close")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	f.done(t, c)
	gr.take("intercepted-fronting")

	conn, err := f.dial("198.51.100.66:80")
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, "GET /echo HTTP/1.1\r\nHost: api.test\r\n\r\n")
	io.Copy(io.Discard, conn)
	conn.Close()
	f.done(t)
	gr.take("deny-secret-in-clear")

	gr.mu.Lock()
	for i, r := range gr.recs {
		if r.Proto == "tcp" {
			r.BytesUp, r.BytesDown = 0, 0
		}
		gr.recs[i] = r
	}
	gr.mu.Unlock()
	got := bytes.ReplaceAll(gr.marshal(t), []byte(f.up.addr), []byte("UPSTREAM"))
	compareGolden(t, filepath.Join("testdata", "audit_records_intercepted.golden"), got)
}

// dnsQuery asks the gate's DNS server for name.
func dnsQuery(t *testing.T, g *Gate, name string, qtype uint16) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp := g.DNS().Handle(ctx, query(t, name, qtype), false)
	if resp == nil {
		t.Fatalf("no answer for %s", name)
	}
	return resp
}

// goldenFlow runs one connection to dst through the gate: guest (nil: the
// guest sends nothing) runs on the guest's end once the gate has accepted
// it, and then the guest reads to the end. It returns when the gate is
// done with the flow.
func goldenFlow(t *testing.T, g *Gate, dst string, guest func(net.Conn)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.HandleTCP(context.Background(), TCPFlow{
			Src:    netip.MustParseAddrPort("10.88.0.2:40000"),
			Dst:    netip.MustParseAddrPort(dst),
			Accept: func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) },
			Refuse: func() { ln.Close() },
		})
	}()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	if c, err := ln.Accept(); err == nil {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if guest != nil {
			guest(c)
		}
		io.Copy(io.Discard, c)
		c.Close()
	}
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("the gate did not finish the flow to %s within 15 s", dst)
	}
}

// compareGolden compares got with the golden file at path, or rewrites
// the file with -update.
func compareGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the golden file (write it with go test -run %s -update): %v", t.Name(), err)
	}
	if bytes.Equal(got, want) {
		return
	}
	gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Errorf("%s line %d:\n got  %s\n want %s", path, i+1, g, w)
		}
	}
}
