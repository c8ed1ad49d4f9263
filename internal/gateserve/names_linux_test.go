package gateserve

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/lockdown"
	"moat.dev/moat/internal/termtest"
	"moat.dev/moat/test/inet"
)

// namesFixture is a service with a names range inside its clients'
// subnet, as on a Docker --internal network whose upper half the gate
// claims: tenant alpha at 100.77.5.2 and beta at 100.77.5.4 share that
// subnet and the range 100.77.5.128/25, with no route but the subnet's.
// Upstreams: SSH-like servers (they speak first) on 2222 and 2223.
type namesFixture struct {
	n           *inet.Net
	svc         *Service
	cfg         *Config
	c           *clientNS
	beta        netip.Addr // beta's source, in the same namespace
	alphaPolicy string
	roots       *x509.CertPool
	db, dbOther *inet.Server // db.test:2222 and :2223
	betaDB      *inet.Server // beta-db.test:2222
}

const namesAlphaRules = `
[network]
use = ["none"]
allow = ["db.test:2222", "allowed.test"]
inspect = true
trust = ["%[1]s"]
`

const namesBetaRules = `
[network]
use = ["none"]
allow = ["beta-db.test:2222"]
`

func startNames(t *testing.T) *namesFixture {
	n := inet.Start(t) // skips without root
	f := &namesFixture{n: n}
	n.SetA("db.test", "198.51.100.30")
	f.db = n.TCP(t, "198.51.100.30", 2222, "SSH-2.0-db.test\r\n")
	f.dbOther = n.TCP(t, "198.51.100.30", 2223, "SSH-2.0-db.test-2223\r\n")
	n.SetA("beta-db.test", "198.51.100.31")
	f.betaDB = n.TCP(t, "198.51.100.31", 2222, "SSH-2.0-beta-db.test\r\n")
	n.SetA("allowed.test", "198.51.100.32")
	n.HTTPS(t, "198.51.100.32", 443, []string{"allowed.test"}, inet.Echo())

	f.c = newClientNS(t, 5)
	f.beta = netip.MustParseAddr("100.77.5.4")
	if out, err := exec.Command("ip", "-n", f.c.name, "addr", "add", f.beta.String()+"/24", "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("adding beta's address: %v: %s", err, out)
	}
	dir := t.TempDir()
	trust := filepath.Join(dir, "upstream-ca.pem")
	must(t, os.WriteFile(trust, n.CA().PEM, 0o644))
	f.alphaPolicy = filepath.Join(dir, "alpha.toml")
	must(t, os.WriteFile(f.alphaPolicy, fmt.Appendf(nil, namesAlphaRules, trust), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "beta.toml"), []byte(namesBetaRules), 0o644))
	conf := filepath.Join(dir, "gate.toml")
	must(t, os.WriteFile(conf, fmt.Appendf(nil, `
[service]
state_dir = "%[1]s/state"
names = "100.77.5.128/25"

[listen]
dns = ["%[2]s:53"]

[upstream]
dns = ["%[3]s"]

[tenants.alpha]
sources = ["%[4]s"]
policy = ["%[1]s/alpha.toml"]

[tenants.beta]
sources = ["%[5]s"]
policy = ["%[1]s/beta.toml"]
`, dir, f.c.gw, n.DNS, f.c.addr, f.beta), 0o644))
	cfg, err := LoadConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	f.cfg = cfg
	ls, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Options{Config: cfg, Listeners: ls, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		ls.Close()
		t.Fatal(err)
	}
	f.svc = svc
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.Serve(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the service did not stop within 10 s")
		}
		// The range is the service's while it runs, and no longer.
		if out, _ := exec.Command("ip", "route", "show", "table", "local", cfg.Names.String()).Output(); len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("the local route for %s outlived the service: %s", cfg.Names, out)
		}
		if err := delTable(cfg.Names); !errors.Is(err, unix.ENOENT) {
			t.Errorf("deleting the nftables table after the service stopped: %v, want ENOENT (gone with the service)", err)
		}
	})
	f.roots = x509.NewCertPool()
	if !f.roots.AppendCertsFromPEM([]byte(mustRead(t, cfg.CACert))) {
		t.Fatalf("%s holds no certificate", cfg.CACert)
	}
	return f
}

// sshLike connects from src to ap, reads the server's first line, and
// returns the connection and that line ("" and the error when the
// connection was refused or reset before a line came).
func (f *namesFixture) sshLike(t *testing.T, src netip.Addr, ap netip.AddrPort) (net.Conn, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := f.c.dial(ctx, "tcp4", ap.String(), src)
	if err != nil {
		return nil, "", err
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := readLine(c)
	if err != nil {
		c.Close()
		return nil, "", err
	}
	c.SetReadDeadline(time.Time{})
	return c, line, nil
}

func readLine(r io.Reader) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for len(b) < 256 {
		if _, err := r.Read(one); err != nil {
			return string(b), err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
	return string(b), nil
}

// resolveFrom asks the service for name's address from src.
func (f *namesFixture) resolveFrom(t *testing.T, src netip.Addr, name string) netip.Addr {
	t.Helper()
	r, err := f.c.query(t, "udp", name, dns.TypeA, src)
	if err != nil {
		t.Fatalf("resolving %s from %s: %v", name, src, err)
	}
	got := answersOf(r)
	if len(got) != 1 {
		t.Fatalf("%s from %s: answers %v, want one", name, src, got)
	}
	return got[0]
}

func TestServiceNames(t *testing.T) {
	f := startNames(t)
	alpha := f.c.addr
	alphaAudit, betaAudit := f.cfg.Tenants[0].Audit, f.cfg.Tenants[1].Audit

	t.Run("the range's table is the service's alone", func(t *testing.T) {
		// Owned by the service's netlink socket (Linux 5.12): another
		// process, say a second service given the same range, cannot
		// remove it.
		if err := delTable(f.cfg.Names); !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EBUSY) {
			t.Errorf("another socket deleting the table: %v, want EPERM", err)
		}
		// A second service given the range stops at start, and a parent
		// cleaning up after its own child leaves the range alone.
		if ic, err := intercept(f.cfg.Names, netip.MustParseAddrPort("127.0.0.1:9")); !errors.Is(err, errRangeTaken) {
			ic.Close()
			t.Errorf("a second interception of %s: %v, want errRangeTaken", f.cfg.Names, err)
		}
		if err := removeInterception(f.cfg.Names); err != nil {
			t.Errorf("removeInterception while the service runs: %v", err)
		}
		if out, _ := exec.Command("ip", "route", "show", "table", "local", f.cfg.Names.String()).Output(); len(strings.TrimSpace(string(out))) == 0 {
			t.Errorf("the running service's local route for %s was removed", f.cfg.Names)
		}
	})

	db := f.resolveFrom(t, alpha, "db.test")
	t.Run("names are answered from the range, stable per tenant", func(t *testing.T) {
		f.n.ResetQueries()
		if !f.cfg.Names.Contains(db) {
			t.Fatalf("db.test resolved to %s, outside the range %s", db, f.cfg.Names)
		}
		denied := f.resolveFrom(t, alpha, "denied.test")
		if !f.cfg.Names.Contains(denied) || denied == db {
			t.Errorf("denied.test resolved to %s; want another address of %s than db.test's %s", denied, f.cfg.Names, db)
		}
		for range 3 {
			if again := f.resolveFrom(t, alpha, "db.test"); again != db {
				t.Errorf("db.test moved from %s to %s", db, again)
			}
		}
		if n := f.n.Asked("denied.test"); n != 0 {
			t.Errorf("the upstream was asked %d times for denied.test", n)
		}
	})

	t.Run("allowed name and port work end to end", func(t *testing.T) {
		c, banner, err := f.sshLike(t, alpha, netip.AddrPortFrom(db, 2222))
		if err != nil {
			t.Fatalf("db.test:2222 through the range: %v", err)
		}
		defer c.Close()
		if banner != "SSH-2.0-db.test\r" {
			t.Errorf("db.test:2222 sent %q, want the upstream's banner", banner)
		}
		if _, err := c.Write([]byte("hello from alpha\n")); err != nil {
			t.Fatal(err)
		}
		waitPayload(t, f.db, "hello from alpha")
		r := waitRecord(t, alphaAudit, func(r audit.Record) bool {
			return r.Name == "db.test" && r.Phase == audit.PhaseStart
		})
		if r.Verdict != audit.Allow || r.Dst != netip.AddrPortFrom(db, 2222).String() || r.Upstream != "198.51.100.30:2222" || r.NameFrom != audit.FromPool {
			t.Errorf("the allowed flow's record: %+v; want allow, dst %s, upstream 198.51.100.30:2222, name from the pool", r, netip.AddrPortFrom(db, 2222))
		}
	})

	t.Run("a port the name is not allowed on is refused and audited", func(t *testing.T) {
		if c, banner, err := f.sshLike(t, alpha, netip.AddrPortFrom(db, 2223)); err == nil {
			c.Close()
			t.Errorf("db.test:2223 sent %q; want a refusal", banner)
		}
		if f.dbOther.Contacted() {
			t.Errorf("the upstream on 2223 was contacted")
		}
		r := waitRecord(t, alphaAudit, func(r audit.Record) bool {
			return r.Name == "db.test" && r.Verdict == audit.Deny
		})
		if r.Dst != netip.AddrPortFrom(db, 2223).String() || r.RejectedBy != audit.StepPolicy {
			t.Errorf("the denial: dst %s, rejected_by %q; want %s, policy", r.Dst, r.RejectedBy, netip.AddrPortFrom(db, 2223))
		}
	})

	t.Run("a tenant's address means nothing to another", func(t *testing.T) {
		// Beta has been given no address: alpha's is no name for it.
		if c, banner, err := f.sshLike(t, f.beta, netip.AddrPortFrom(db, 2222)); err == nil {
			c.Close()
			t.Errorf("beta reached %s:2222 (alpha's db.test) and got %q; want a refusal", db, banner)
		}
		r := waitRecord(t, betaAudit, func(r audit.Record) bool { return r.Proto == "tcp" && r.Verdict == audit.Deny })
		if r.Dst != netip.AddrPortFrom(db, 2222).String() || r.Name != "" || r.Reason != audit.ReasonPoolUnbound {
			t.Errorf("beta's denial: %+v; want dst %s, no name, %q", r, netip.AddrPortFrom(db, 2222), audit.ReasonPoolUnbound)
		}
		hits := f.db.Hits()
		// Each tenant's bindings start at the range's first address, so
		// beta's first name gets the address alpha's db.test has; for
		// beta it is beta-db.test.
		bdb := f.resolveFrom(t, f.beta, "beta-db.test")
		if bdb != db {
			t.Errorf("beta-db.test for beta: %s; want %s, the first address of beta's own bindings", bdb, db)
		}
		c, banner, err := f.sshLike(t, f.beta, netip.AddrPortFrom(bdb, 2222))
		if err != nil {
			t.Fatalf("beta to beta-db.test:2222: %v", err)
		}
		c.Close()
		if banner != "SSH-2.0-beta-db.test\r" || f.db.Hits() != hits {
			t.Errorf("beta at %s:2222 got %q (db.test hits %d -> %d); want beta-db.test's banner and db.test untouched", bdb, banner, hits, f.db.Hits())
		}
		if c, _, err := f.sshLike(t, alpha, netip.AddrPortFrom(db, 2222)); err != nil {
			t.Errorf("alpha at the same address after beta's lookup: %v", err)
		} else {
			c.Close()
		}
	})

	t.Run("https by SNI at a range address", func(t *testing.T) {
		resp := get(t, f.c.client(t, f.roots), "https://allowed.test/hello", nil)
		if resp.status != 200 {
			t.Errorf("GET https://allowed.test/hello: %d %s", resp.status, resp.body)
		}
		if resp := get(t, f.c.client(t, f.roots), "https://denied.test/", nil); resp.status != http.StatusForbidden {
			t.Errorf("GET https://denied.test/: %d, want the service's 403", resp.status)
		}
	})

	t.Run("unknown source gets nothing", func(t *testing.T) {
		if c, banner, err := f.sshLike(t, f.c.stray, netip.AddrPortFrom(db, 2222)); err == nil {
			c.Close()
			t.Errorf("a source no tenant has got %q; want a reset", banner)
		}
		rec := waitRecord(t, f.cfg.Audit, func(r audit.Record) bool { return r.Proto == "tcp" })
		if rec.RejectedBy != audit.StepSource || rec.Dst != netip.AddrPortFrom(db, 2222).String() {
			t.Errorf("unknown source's record: %+v", rec)
		}
	})

	t.Run("reload keeps established connections", func(t *testing.T) {
		c, _, err := f.sshLike(t, alpha, netip.AddrPortFrom(db, 2222))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rules := strings.Replace(mustRead(t, f.alphaPolicy), `"db.test:2222", `, "", 1)
		must(t, os.WriteFile(f.alphaPolicy, []byte(rules), 0o644))
		if err := f.svc.Reload(); err != nil {
			t.Fatalf("reload: %v", err)
		}
		if _, err := c.Write([]byte("after the reload\n")); err != nil {
			t.Fatalf("writing on the connection opened before the reload: %v", err)
		}
		waitPayload(t, f.db, "after the reload")
		if again := f.resolveFrom(t, alpha, "db.test"); again != db {
			t.Errorf("db.test moved from %s to %s across the reload", db, again)
		}
		if c2, banner, err := f.sshLike(t, alpha, netip.AddrPortFrom(db, 2222)); err == nil {
			c2.Close()
			t.Errorf("a new connection after the reload removed db.test:2222 got %q; want a refusal", banner)
		}
	})
}

// delTable deletes the names range's nftables table from a socket of its
// own, as another process would.
func delTable(p netip.Prefix) error {
	fd, err := nftSocket()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return nftBatch(fd, delTableMsg(tableName(p)))
}

// waitPayload waits up to 5 s for a connection to s to have carried want.
func waitPayload(t *testing.T, s *inet.Server, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, p := range s.Payloads() {
			if strings.Contains(string(p), want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upstream did not receive %q within 5 s (got %q)", want, s.Payloads())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServeJailedNames runs `moat gate serve` with a names range: the
// range is set up as root before the jail, connections to it are served
// by the jailed process, SIGHUP keeps an established one, and the range's
// route goes when the service does.
func TestServeJailedNames(t *testing.T) {
	n := inet.Start(t) // skips without root
	n.SetA("db.test", "198.51.100.30")
	db := n.TCP(t, "198.51.100.30", 2222, "SSH-2.0-db.test\r\n")
	c := newClientNS(t, 6)
	names := netip.MustParsePrefix("100.77.6.128/25")

	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	policyFile := filepath.Join(dir, "alpha.toml")
	rules := "[network]\nuse = [\"none\"]\nallow = [\"db.test:2222\"]\n"
	must(t, os.WriteFile(policyFile, []byte(rules), 0o644))
	conf := filepath.Join(dir, "gate.toml")
	must(t, os.WriteFile(conf, fmt.Appendf(nil, `
[service]
state_dir = "%[1]s/state"
names = "%[5]s"

[listen]
dns = ["%[2]s:53"]

[upstream]
dns = ["%[3]s"]

[tenants.alpha]
sources = ["%[4]s"]
policy = [%[6]q]
`, dir, c.gw, n.DNS, c.addr, names, policyFile), 0o644))

	stderr := &termtest.Screen{}
	cmd := exec.Command(moatBinary(t), "gate", "serve", "--config", conf)
	cmd.Stderr = stderr
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		cmd.Process.Signal(unix.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("moat gate serve stopped with %v, want a clean exit", err)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Error("moat gate serve did not stop within 10 s of SIGTERM")
		}
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
		if t.Failed() {
			t.Logf("moat gate serve's log:\n%s", stderr.String())
		}
	})

	var addr netip.Addr
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if addr, err = c.resolve(t, "db.test"); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("moat gate serve exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("moat gate serve did not answer DNS within 20 s: %v\n%s", err, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !names.Contains(addr) {
		t.Fatalf("db.test resolved to %s, outside %s", addr, names)
	}
	child := childOf(t, cmd.Process.Pid)
	if err := lockdown.Verify(child, lockdown.Config{UID: 65534, GID: 65534, NoFile: 65536}); err != nil {
		t.Errorf("the serving process %d is not jailed: %v", child, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := c.dial(ctx, "tcp4", netip.AddrPortFrom(addr, 2222).String(), netip.Addr{})
	if err != nil {
		t.Fatalf("db.test:2222 through the jailed service: %v", err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := readLine(conn); err != nil || line != "SSH-2.0-db.test\r" {
		t.Fatalf("db.test:2222 sent %q, %v; want its banner", line, err)
	}

	must(t, os.WriteFile(policyFile, []byte(strings.Replace(rules, "db.test:2222", "other.test:2222", 1)), 0o644))
	must(t, cmd.Process.Signal(unix.SIGHUP))
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(stderr.String(), "gate service reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload within 5 s of SIGHUP")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := conn.Write([]byte("after SIGHUP\n")); err != nil {
		t.Fatalf("writing on the connection opened before SIGHUP: %v", err)
	}
	waitPayload(t, db, "after SIGHUP")
	if c2, err := c.dial(ctx, "tcp4", netip.AddrPortFrom(addr, 2222).String(), netip.Addr{}); err == nil {
		c2.SetReadDeadline(time.Now().Add(3 * time.Second))
		if line, err := readLine(c2); err == nil {
			t.Errorf("a new connection after SIGHUP removed db.test:2222 got %q; want a refusal", line)
		}
		c2.Close()
	}

	conn.Close() // else the stop waits out the drain for it
	stop()
	stopped = true
	if out, _ := exec.Command("ip", "route", "show", "table", "local", names.String()).Output(); len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("the local route for %s outlived the service: %s", names, out)
	}
	if err := delTable(names); !errors.Is(err, unix.ENOENT) {
		t.Errorf("the nftables table after the service stopped: %v, want ENOENT", err)
	}
}
