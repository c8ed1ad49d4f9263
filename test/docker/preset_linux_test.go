package docker

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

const presetPolicy = `[sandbox]
name = "NAME"
image = "IMAGE"
runtime = "docker"

[network]
trust = ["WS/upstream-ca.pem"]

[env]
PATH = "WS/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
`

// fakeClaude stands in for Claude Code, whose npm package needs node and
// a registry that the workload image here has neither of: it shows what
// the session gave it (the preset's arguments and variables, the key's
// placeholder, the CA's variables), the settings the seeding role wrote
// before it, and what the gate does with its API requests.
const fakeClaude = `#!/bin/sh
echo "args=$*"
echo "key=$ANTHROPIC_API_KEY"
echo "is_sandbox=$IS_SANDBOX"
echo "node_ca=$NODE_EXTRA_CA_CERTS"
echo "ssl_cert_file=${SSL_CERT_FILE:-unset}"
echo "--- claude.json"; cat "$HOME/.claude.json"; echo
echo "--- settings.json"; cat "$HOME/.claude/settings.json"; echo
echo "--- api"; curl -sS -m 10 https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -d '{}'; echo
echo "--- telemetry"; curl -sS -m 10 -o /dev/null -w 'code=%{http_code}' -X POST https://api.anthropic.com/api/event_logging/batch -d '{}'; echo
`

// standin is the model API's stand-in on the egress bridge: a resolver
// that names it for api.anthropic.com, and its HTTPS server, which
// records the key and path of every request.
type standin struct {
	mu     sync.Mutex
	keys   []string
	paths  []string
	bodies []string
	auths  []string // Authorization headers
}

func (s *standin) seen() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...), append([]string(nil), s.paths...)
}

// leafFor makes a CA and a leaf for names, which the gate verifies
// through [network] trust.
func leafFor(t *testing.T, names ...string) ([]byte, tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "moat docker preset test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	lkey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	l := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	lDER, err := x509.CreateCertificate(rand.Reader, l, ca, &lkey.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{lDER}, PrivateKey: lkey}
}

// startStandin serves DNS on hostEnd:dnsPort, naming hostEnd for names,
// and HTTPS on hostEnd:443.
func startStandin(t *testing.T, dnsPort int, leaf tls.Certificate, names ...string) *standin {
	s := &standin{}
	lc := net.ListenConfig{Control: freebind}
	ctx := context.Background()
	pc, err := lc.ListenPacket(ctx, "udp4", fmt.Sprintf("%s:%d", hostEnd, dnsPort))
	if err != nil {
		t.Fatalf("listening for DNS on %s: %v", hostEnd, err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, qq := range q.Question {
			if slices.Contains(names, strings.TrimSuffix(qq.Name, ".")) && qq.Qtype == dns.TypeA {
				rr, _ := dns.NewRR(qq.Name + " 60 IN A " + hostEnd)
				m.Answer = append(m.Answer, rr)
			}
		}
		if len(m.Answer) == 0 {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	l, err := lc.Listen(ctx, "tcp4", hostEnd+":443")
	if err != nil {
		t.Fatalf("listening for HTTPS on %s: %v", hostEnd, err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		s.mu.Lock()
		s.keys = append(s.keys, r.Header.Get("X-Api-Key"))
		s.paths = append(s.paths, r.URL.Path)
		s.bodies = append(s.bodies, string(body))
		s.auths = append(s.auths, r.Header.Get("Authorization"))
		s.mu.Unlock()
		fmt.Fprintln(w, "standin-answer")
	}), ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{leaf}}))
	t.Cleanup(func() { hs.Close() })
	return s
}

// TestDockerPreset: `moat run claude` on a Docker sandbox that was
// already running without it, as on gVisor: the preset's arguments and
// variables, its seeding role's settings, the CA's variables, the key a
// placeholder in the guest and the real value on the wire to the API
// host only, and the preset's telemetry block.
func TestDockerPreset(t *testing.T) {
	caPEM, leaf := leafFor(t, "api.anthropic.com")
	s := newSandbox(t, presetPolicy, map[string][]byte{"upstream-ca.pem": caPEM})
	if err := os.MkdirAll(filepath.Join(s.ws, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.ws, "bin", "claude"), []byte(fakeClaude), 0o755); err != nil {
		t.Fatal(err)
	}
	// Its own resolver beside the egress bridge's: the shared fixture's
	// names are not the preset's.
	const dnsPort = 5353
	s.env = append(s.env, fmt.Sprintf("MOAT_UPSTREAM_DNS=%s:%d", hostEnd, dnsPort))
	api := startStandin(t, dnsPort, leaf, "api.anthropic.com")
	canary := fmt.Sprintf("sk-ant-docker-canary-%d", time.Now().UnixNano())

	// Started without the preset: its first use reaches the running
	// gate (a reload), not only the next start.
	s.must(t, "true")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, "run", "--trust-project", "claude", "--", "-p", "hello")
	cmd.Dir = s.ws
	// The key only in the environment of the command that uses the preset.
	cmd.Env = append(append([]string(nil), s.env...), "ANTHROPIC_API_KEY="+canary)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("moat run claude: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	got := out.String()
	t.Logf("the fake claude's output:\n%s", got)
	field := func(k string) string {
		for _, l := range strings.Split(got, "\n") {
			if v, ok := strings.CutPrefix(l, k+"="); ok {
				return v
			}
		}
		return ""
	}
	if a := field("args"); a != "--dangerously-skip-permissions -p hello" {
		t.Errorf("claude's arguments: %q; want the preset's flag, then the user's", a)
	}
	key := field("key")
	if !strings.HasPrefix(key, "moat-ph-") {
		gate := filepath.Join(s.home, "state", "sandboxes", s.name, "gate")
		var files []string
		for _, f := range []string{"gate.toml", "preset.toml", "state/placeholders/workload.env"} {
			b, _ := os.ReadFile(filepath.Join(gate, f))
			files = append(files, f+":\n"+string(b))
		}
		logs, _ := exec.Command("docker", "logs", "--tail", "30", "moat-"+s.name+"-gate").CombinedOutput()
		t.Errorf("ANTHROPIC_API_KEY in the guest: %q; want a placeholder\nmoat's stderr:\n%s\n%s\nthe gate's log:\n%s", key, errb.String(), strings.Join(files, "\n"), logs)
	}
	if strings.Contains(got+errb.String(), canary) {
		t.Error("the real key reached the guest or the session's output")
	}
	if field("is_sandbox") != "1" {
		t.Errorf("IS_SANDBOX: %q; want the preset's 1", field("is_sandbox"))
	}
	if field("node_ca") == "" || field("ssl_cert_file") != "unset" {
		t.Errorf("NODE_EXTRA_CA_CERTS %q, SSL_CERT_FILE %q; want the CA for node and SSL_CERT_FILE unset", field("node_ca"), field("ssl_cert_file"))
	}
	for _, w := range []string{`"hasCompletedOnboarding": true`, `"bypassPermissionsModeAccepted": true`, `"skipDangerousModePermissionPrompt": true`} {
		if !strings.Contains(strings.ReplaceAll(got, `":true`, `": true`), w) {
			t.Errorf("the seeded settings lack %s", w)
		}
	}
	if len(key) > 20 && !strings.Contains(got, key[len(key)-20:]) {
		t.Error("~/.claude.json does not approve the placeholder key (customApiKeyResponses)")
	}
	if !strings.Contains(got, "standin-answer") {
		t.Errorf("the API request through the gate did not reach the stand-in")
	}
	if !strings.Contains(got, "code=403") {
		t.Errorf("the preset's telemetry block: want the gate's 403 for POST /api/event_logging/batch")
	}
	keys, paths := api.seen()
	for i, k := range keys {
		if k != canary {
			t.Errorf("the stand-in got key %q on %s; want the real value, swapped in by the gate", k, paths[i])
		}
		if strings.HasPrefix(paths[i], "/api/event_logging/") {
			t.Errorf("the stand-in saw %s, which the preset blocks", paths[i])
		}
	}
	if len(keys) == 0 {
		t.Error("the stand-in saw no request")
	}
	// The value in no file moat keeps: the gate holds it in memory.
	filepath.WalkDir(s.home, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(canary)) {
			t.Errorf("%s holds the real key", p)
		}
		return nil
	})
	// A later session without the preset has the placeholder too, as on
	// gVisor (the record keeps it).
	if o := s.must(t, "sh", "-c", "echo key=$ANTHROPIC_API_KEY"); strings.TrimSpace(o) != "key="+key {
		t.Errorf("a later plain session: %q; want the same placeholder %s", strings.TrimSpace(o), key)
	}
}
