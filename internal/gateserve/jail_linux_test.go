package gateserve

import (
	"bufio"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/lockdown"
	"moat.dev/moat/internal/termtest"
	"moat.dev/moat/test/inet"
)

// moatBinary is $MOAT_BIN (scripts/test.sh builds one, with moat-gate
// beside it) or moat and moat-gate built here into one directory without
// cgo, as the jail needs: `moat gate serve` execs the moat-gate beside it.
func moatBinary(t *testing.T) string {
	if b := os.Getenv("MOAT_BIN"); b != "" {
		return b
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/", "moat.dev/moat/cmd/moat", "moat.dev/moat/cmd/moat-gate")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building moat and moat-gate without cgo: %v\n%s", err, out)
	}
	return filepath.Join(dir, "moat")
}

// TestServeJailed runs `moat gate serve` as a person does: as root, it
// must end up serving as service.uid in lockdown's jail, and SIGHUP must
// reload a rule without cutting an open connection.
func TestServeJailed(t *testing.T) {
	n := inet.Start(t) // skips without root
	mux := http.NewServeMux()
	mux.Handle("/events", inet.SSE(5, 300*time.Millisecond))
	mux.Handle("/", inet.Echo())
	n.SetA("allowed.test", "198.51.100.20")
	n.HTTPS(t, "198.51.100.20", 443, []string{"allowed.test"}, mux)
	c := newClientNS(t, 3)

	// Readable by service.uid: a reload reads them again from the jail.
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	trust := filepath.Join(dir, "upstream-ca.pem")
	must(t, os.WriteFile(trust, n.CA().PEM, 0o644))
	policyFile := filepath.Join(dir, "alpha.toml")
	rules := fmt.Sprintf("[network]\nuse = [\"none\"]\nallow = [\"allowed.test\"]\ninspect = true\ntrust = [%q]\n\n[secrets.API_TOKEN]\nfrom = \"env:MOAT_GATESERVE_TEST_TOKEN\"\nhosts = [\"allowed.test\"]\n", trust)
	must(t, os.WriteFile(policyFile, []byte(rules), 0o644))
	conf := filepath.Join(dir, "gate.toml")
	must(t, os.WriteFile(conf, fmt.Appendf(nil, `
[service]
state_dir = "%[1]s/state"
uid = 65534

[listen]
dns = ["%[2]s:53"]
https = ["%[2]s:443"]

[upstream]
dns = ["%[3]s"]

[tenants.alpha]
sources = ["%[4]s"]
policy = [%[5]q]
`, dir, c.gw, n.DNS, c.addr, policyFile), 0o644))

	canary := "moat-canary-" + randHex(t, 16)
	stderr := &termtest.Screen{}
	cmd := exec.Command(moatBinary(t), "gate", "serve", "--config", conf)
	cmd.Env = append(os.Environ(), "MOAT_GATESERVE_TEST_TOKEN="+canary)
	cmd.Stderr = stderr
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Error("moat gate serve did not stop within 10 s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("moat gate serve's log:\n%s", stderr.String())
		}
	})

	// Up when it answers DNS; bounded.
	deadline := time.Now().Add(20 * time.Second)
	var lastErr error
	for {
		_, lastErr = c.resolve(t, "probe.invalid")
		if lastErr == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("moat gate serve exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "state", "audit", "alpha.jsonl"))
			t.Fatalf("moat gate serve did not answer DNS within 20 s: %v\n%s\naudit:\n%s", lastErr, stderr.String(), b)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if _, err := c.resolve(t, "allowed.test"); err != nil {
		t.Errorf("allowed.test: %v", err)
	}
	// The child that serves is jailed: uid 65534, no capabilities,
	// seccomp, lockdown's root.
	child := childOf(t, cmd.Process.Pid)
	if err := lockdown.Verify(child, lockdown.Config{UID: 65534, GID: 65534, NoFile: 65536}); err != nil {
		t.Errorf("the serving process %d is not jailed: %v", child, err)
	}

	pem, err := os.ReadFile(filepath.Join(dir, "state", "ca.pem"))
	must(t, err)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("the CA file holds no certificate")
	}
	if r := get(t, c.client(t, roots), "https://allowed.test/", nil); r.status != 200 {
		t.Fatalf("GET https://allowed.test/ through the jailed service: %d %s", r.status, r.body)
	}

	// SIGHUP with a stream open: the stream ends whole, new requests
	// see the new rules.
	resp, err := c.client(t, roots).Get("https://allowed.test/events?n=5&gap_ms=400")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	events := 0
	readEvent := func() bool {
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: ") {
				events++
				return true
			}
			if err != nil {
				return false
			}
		}
	}
	if !readEvent() {
		t.Fatal("no first event")
	}
	must(t, os.WriteFile(policyFile, []byte(strings.Replace(rules, `allow = ["allowed.test"]`, `allow = ["other.test"]`, 1)), 0o644))
	must(t, cmd.Process.Signal(syscall.SIGHUP))
	for readEvent() {
	}
	if events != 5 {
		t.Errorf("the stream open across SIGHUP carried %d of 5 events", events)
	}
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(stderr.String(), "gate service reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload within 5 s of SIGHUP")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := get(t, c.client(t, roots), "https://allowed.test/", nil); r.status != http.StatusForbidden {
		t.Errorf("after SIGHUP, GET https://allowed.test/: %d, want 403", r.status)
	}

	// The value was used (positive control) and is in no log.
	auditPath := filepath.Join(dir, "state", "audit", "alpha.jsonl")
	waitRecord(t, auditPath, func(r audit.Record) bool { return r.Name == "allowed.test" && r.RejectedBy == audit.StepPolicy })
	b, _ := os.ReadFile(auditPath)
	if strings.Contains(string(b), canary) || strings.Contains(stderr.String(), canary) {
		t.Errorf("the secret's value is in the audit or the service's log")
	}
}

// childOf is the one child of pid (any of its threads may have started it).
func childOf(t *testing.T, pid int) int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		kids = append(kids, strings.Fields(string(b))...)
	}
	if len(kids) != 1 {
		t.Fatalf("process %d has children %q, want one", pid, kids)
	}
	k, err := strconv.Atoi(kids[0])
	if err != nil {
		t.Fatal(err)
	}
	return k
}
