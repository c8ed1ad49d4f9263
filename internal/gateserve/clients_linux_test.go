package gateserve

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/test/inet"
)

// TestRealClients shows that the service's interception needs no flag in
// the clients an agent runs: each one is run unchanged in tenant alpha's
// namespace, with the service as its resolver and the service's CA
// installed the way moat's guest init installs it (appended to the system
// bundle; NODE_EXTRA_CA_CERTS, REQUESTS_CA_BUNDLE and PIP_CERT; never
// SSL_CERT_FILE, see internal/guest/env.go). The upstream's own CA is in no
// store the clients read, so a verified connection is one the service
// terminated. A denied host gets the service's 403 in each.
func TestRealClients(t *testing.T) {
	python := findPython(t)
	for _, tool := range []string{"curl", "git", "node", "nsenter", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: this test runs the real client (install it to run the test)", tool)
		}
	}
	f := start(t)

	// code.test: a smart-HTTP git server (git http-backend) and a simple
	// package index with one wheel, the two things an agent fetches
	// besides plain HTTPS.
	gitRoot := t.TempDir()
	inet.GitRepo(t, gitRoot, "probe.git", map[string]string{"README": "moat probe repository\n"})
	wheelName, wheel := buildWheel(t)
	sum := sha256.Sum256(wheel)
	mux := http.NewServeMux()
	mux.Handle("/git/", http.StripPrefix("/git", inet.Git(gitRoot)))
	index := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/files/%[1]s#sha256=%[2]s\">%[1]s</a></body></html>\n", wheelName, hex.EncodeToString(sum[:]))
	}
	mux.HandleFunc("/simple/moatprobe/", index)
	mux.HandleFunc("/files/"+wheelName, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(wheel)
	})
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello from code.test") })
	f.n.SetA("code.test", "198.51.100.20")
	code := f.n.HTTPS(t, "198.51.100.20", 443, []string{"code.test"}, mux)
	allowAlso(t, f, "code.test")

	// What the guest's init would leave in place: the system bundle with
	// the CA appended, and a resolv.conf naming the service.
	dir := t.TempDir()
	caPEM, err := os.ReadFile(f.cfg.CACert)
	must(t, err)
	bundle := systemBundleWith(t, dir, caPEM)
	resolv := filepath.Join(dir, "resolv.conf")
	must(t, os.WriteFile(resolv, []byte("nameserver "+f.a.gw.String()+"\noptions timeout:2 attempts:1\n"), 0o644))
	cl := &realClient{ns: f.a.name, resolv: resolv, bundle: bundle, env: []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "LANG=C",
		"NODE_EXTRA_CA_CERTS=" + f.cfg.CACert,
		"REQUESTS_CA_BUNDLE=" + bundle, "PIP_CERT=" + bundle,
		// No user or system configuration: the clients' defaults.
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"PIP_CONFIG_FILE=/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_CACHE_DIR=1",
		"PYTHONNOUSERSITE=1",
	}}

	const pyURLLib = `import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=10)
    print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
`
	const pyRequests = `import sys, requests
r = requests.get(sys.argv[1], timeout=10)
print(r.status_code); print(r.text)
`
	const nodeFetch = `fetch(process.argv[1]).then(async r => { console.log(r.status); console.log(await r.text()) })
  .catch(e => { console.error(e, e.cause); process.exit(2) })`
	// Each prints the status on its first line, then the body.
	clients := []struct {
		name string
		argv func(url string) []string
	}{
		{"curl", func(u string) []string {
			return []string{"curl", "-sS", "--max-time", "10", "-w", "%{http_code}\n", "-o", "/dev/stderr", u}
		}},
		{"python urllib", func(u string) []string { return []string{python, "-c", pyURLLib, u} }},
		{"python requests", func(u string) []string { return []string{python, "-c", pyRequests, u} }},
		{"node fetch", func(u string) []string { return []string{"node", "-e", nodeFetch, u} }},
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			out, err := cl.run(t, c.argv("https://code.test/hello")...)
			if err != nil || firstLine(out) != "200" {
				t.Fatalf("GET https://code.test/hello: %v\n%s", err, out)
			}
			if c.name != "curl" && !strings.Contains(out, "hello from code.test") {
				t.Errorf("GET https://code.test/hello: no body from the upstream:\n%s", out)
			}
			out, err = cl.run(t, c.argv("https://denied.test/")...)
			if err != nil || firstLine(out) != "403" {
				t.Errorf("GET https://denied.test/: %v, want status 403:\n%s", err, out)
			}
		})
	}

	t.Run("git clone over smart http", func(t *testing.T) {
		dst := filepath.Join(dir, "clone")
		out, err := cl.run(t, "git", "clone", "-q", "https://code.test/git/probe.git", dst)
		if err != nil {
			t.Fatalf("git clone: %v\n%s", err, out)
		}
		if b, err := os.ReadFile(filepath.Join(dst, "README")); err != nil || string(b) != "moat probe repository\n" {
			t.Errorf("the clone's README: %q, %v", b, err)
		}
		out, err = cl.run(t, "git", "ls-remote", "https://denied.test/git/probe.git")
		if err == nil || !strings.Contains(out, "403") {
			t.Errorf("git ls-remote https://denied.test/...: %v, want a failure naming 403:\n%s", err, out)
		}
	})

	t.Run("pip download from a local index", func(t *testing.T) {
		dst := filepath.Join(dir, "wheels")
		out, err := cl.run(t, python, "-m", "pip", "download", "-q", "--no-deps", "-d", dst, "--index-url", "https://code.test/simple/", "moatprobe")
		if err != nil {
			t.Fatalf("pip download: %v\n%s", err, out)
		}
		if b, err := os.ReadFile(filepath.Join(dst, wheelName)); err != nil || !bytes.Equal(b, wheel) {
			t.Errorf("the downloaded wheel: %d bytes, %v; want the %d served", len(b), err, len(wheel))
		}
		out, err = cl.run(t, python, "-m", "pip", "download", "-vv", "--no-deps", "--retries", "0", "-d", filepath.Join(dir, "denied"), "--index-url", "https://denied.test/simple/", "moatprobe")
		if err == nil || !strings.Contains(out, "403") {
			t.Errorf("pip download from https://denied.test/simple/: %v, want a failure naming 403:\n%s", err, out)
		}
	})

	if code.Hits() == 0 {
		t.Errorf("code.test was never reached: the positive control failed")
	}
	if f.denied.Contacted() {
		t.Errorf("the denied upstream was contacted")
	}

	// The negative control: without the CA in the system bundle, curl
	// refuses the service's certificate, so the successes above came from
	// the installed CA and not from a client that verifies nothing.
	t.Run("curl without the CA refuses", func(t *testing.T) {
		bare := *cl
		bare.bundle = "/etc/ssl/certs/ca-certificates.crt"
		out, err := bare.run(t, "curl", "-sS", "--max-time", "10", "-o", "/dev/null", "https://code.test/hello")
		if err == nil || !strings.Contains(out, "certificate") {
			t.Errorf("curl with the system bundle alone: %v, want a certificate failure:\n%s", err, out)
		}
	})
}

// allowAlso adds name to tenant alpha's allow list, live.
func allowAlso(t *testing.T, f *fixture, name string) {
	t.Helper()
	rules := strings.Replace(mustRead(t, f.alphaPolicy), `"allowed.test", `, `"allowed.test", "`+name+`", `, 1)
	must(t, os.WriteFile(f.alphaPolicy, []byte(rules), 0o644))
	if err := f.svc.Reload(); err != nil {
		t.Fatalf("allowing %s: %v", name, err)
	}
}

// systemBundleWith writes the host's system bundle with ca appended into
// dir, as the guest's init completes a bundle, and returns its path.
func systemBundleWith(t *testing.T, dir string, ca []byte) string {
	t.Helper()
	system, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		t.Skipf("no system bundle at /etc/ssl/certs/ca-certificates.crt (%v): the test appends the CA to it as init does", err)
	}
	f, err := os.CreateTemp(dir, "ca-certificates-*.crt")
	must(t, err)
	defer f.Close()
	if _, err := f.Write(append(append(system, '\n'), ca...)); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// realClient runs a program in a client namespace, in a private mount
// namespace where resolv and bundle are bind-mounted over
// /etc/resolv.conf and the system bundle: the host's files are not touched.
type realClient struct {
	ns, resolv, bundle string
	env                []string
	cpu                time.Duration // user and system time of the last run's program
}

// run returns the program's stdout then its stderr.
func (c *realClient) run(t *testing.T, argv ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const script = `mount --bind "$MOAT_T_RESOLV" /etc/resolv.conf && mount --bind "$MOAT_T_BUNDLE" /etc/ssl/certs/ca-certificates.crt && exec "$@"`
	args := append([]string{"--net=/run/netns/" + c.ns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"}, argv...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Env = append(append([]string{}, c.env...), "MOAT_T_RESOLV="+c.resolv, "MOAT_T_BUNDLE="+c.bundle)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if cmd.ProcessState != nil {
		c.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	return stdout.String() + stderr.String(), err
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}

// findPython is the interpreter with requests and pip, or a skip.
func findPython(t *testing.T) string {
	for _, p := range []string{"/root/.pyenv/shims/python3", "python3"} {
		out, err := exec.Command(p, "-c", "import requests, pip, sys; print(sys.executable)").Output()
		if err == nil {
			return strings.TrimSpace(string(out))
		}
	}
	t.Skip("no python3 with requests and pip: this test runs them as real clients (install python3-requests and python3-pip)")
	return ""
}

// buildWheel is a minimal pure-Python wheel, moatprobe 0.1.
func buildWheel(t *testing.T) (string, []byte) {
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	files := []struct{ name, body string }{
		{"moatprobe/__init__.py", "VERSION = \"0.1\"\n"},
		{"moatprobe-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: moatprobe\nVersion: 0.1\n"},
		{"moatprobe-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		w, err := z.Create(f.name)
		must(t, err)
		w.Write([]byte(f.body))
		s := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(s[:]), len(f.body))
	}
	record.WriteString("moatprobe-0.1.dist-info/RECORD,,\n")
	w, err := z.Create("moatprobe-0.1.dist-info/RECORD")
	must(t, err)
	w.Write([]byte(record.String()))
	must(t, z.Close())
	return "moatprobe-0.1-py3-none-any.whl", buf.Bytes()
}
