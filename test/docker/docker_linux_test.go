package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/miekg/dns"

	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/dockerrt/engine"
)

// ready fails or skips the test unless a Docker engine answers, as
// MOAT_DOCKER (set by scripts/test.sh) says.
func ready(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root (moat's Docker runtime edits the host's iptables and enters the workload's netns); run: sudo scripts/test.sh")
	}
	switch v := os.Getenv("MOAT_DOCKER"); {
	case strings.HasPrefix(v, "fail"):
		t.Fatalf("scripts/docker.sh could not make a Docker engine available: %s", v)
	case strings.HasPrefix(v, "skip"):
		t.Skipf("no Docker engine on this host: %s", v)
	case v == "":
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e, err := engine.Connect(ctx)
		if err != nil {
			t.Skipf("MOAT_DOCKER is unset and %v; run scripts/docker.sh (or scripts/test.sh, which runs it)", err)
		}
		e.Close()
	}
}

// workloadRuntime is the workload's runtime these tests ask for:
// $MOAT_DOCKER_RUNTIME (scripts/test.sh runs them under runc and runsc),
// else runsc when Docker has it, as moat picks.
func workloadRuntime(t *testing.T) string {
	if rt := os.Getenv(dockerrt.RuntimeEnv); rt != "" {
		return rt
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := engine.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ok, err := e.HasRuntime(ctx, "runsc")
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		return "runsc"
	}
	return "runc"
}

// moatBin is $MOAT_BIN, or moat built here once, without cgo. Either way
// moat runs moat-docker, moat-gate and moat-sandbox (the container's init)
// from its own directory, so they are built beside it: the binaries under
// test are the ones a user installs.
var moatBin = sync.OnceValues(func() (string, error) {
	if b := os.Getenv("MOAT_BIN"); b != "" {
		for _, s := range []string{"moat-docker", "moat-gate", "moat-sandbox"} {
			if _, err := os.Stat(filepath.Join(filepath.Dir(b), s)); err != nil {
				return "", fmt.Errorf("MOAT_BIN is %s, but %s is not beside it (scripts/setup.sh builds them all): %v", b, s, err)
			}
		}
		return b, nil
	}
	dir, err := os.MkdirTemp("", "moat-docker-test-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "moat.dev/moat/cmd/moat", "moat.dev/moat/cmd/moat-docker", "moat.dev/moat/cmd/moat-gate", "moat.dev/moat/cmd/moat-sandbox")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building moat, moat-docker, moat-gate and moat-sandbox: %v\n%s", err, out)
	}
	return filepath.Join(dir, "moat"), nil
})

// workloadImage imports, once per busybox binary, an image made from the
// host's static busybox (scripts/setup.sh installs it): no registry. It
// returns the tag.
func workloadImage(t *testing.T, c *client.Client) string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("reading /bin/busybox (apt-get install busybox-static): %v", err)
	}
	curl := curlFiles()
	h := sha256.New()
	h.Write(bb)
	for _, f := range curl {
		h.Write([]byte(f.name))
		h.Write(f.data)
	}
	ref := "moat-test-busybox:" + hex.EncodeToString(h.Sum(nil)[:6])
	ctx := context.Background()
	if _, err := c.ImageInspect(ctx, ref); err == nil {
		return ref
	}
	out, err := exec.Command("/bin/busybox", "--list-full").Output()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64) {
		tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: mode})
	}
	file := func(name string, mode int64, data []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data))})
		tw.Write(data)
	}
	for _, d := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "etc/ssl", "etc/ssl/certs", "root", "home", "proc", "sys", "dev", "run", "var"} {
		dir(d, 0o755)
	}
	dir("tmp", 0o1777)
	file("bin/busybox", 0o755, bb)
	for _, applet := range strings.Fields(string(out)) {
		if applet == "bin/busybox" {
			continue
		}
		tw.WriteHeader(&tar.Header{Name: applet, Typeflag: tar.TypeSymlink, Linkname: "/bin/busybox", Mode: 0o777})
	}
	// curl and its libraries, from the host, for HTTPS that verifies.
	for _, d := range []string{"lib", "lib/x86_64-linux-gnu", "lib64"} {
		dir(d, 0o755)
	}
	for _, f := range curl {
		file(f.name, 0o755, f.data)
	}
	file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	file("etc/group", 0o644, []byte("root:x:0:\n"))
	// The image's own roots, as a distribution ships them: init adds the
	// gate's CA to them, and only then points REQUESTS_CA_BUNDLE at
	// the bundle (pointing it at the CA alone would refuse every host
	// the gate does not inspect).
	if roots, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt"); err == nil {
		file("etc/ssl/certs/ca-certificates.crt", 0o644, roots)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	rc, err := c.ImageImport(ctx, image.ImportSource{Source: &buf, SourceName: "-"}, ref, image.ImportOptions{})
	if err != nil {
		t.Fatalf("importing the workload image: %v", err)
	}
	io.Copy(io.Discard, rc)
	rc.Close()
	return ref
}

// upstream is the positive control's side of the egress network: a DNS
// server that answers allowed.test and logs every question, and an HTTP
// server, both on the egress bridge's host address.
type upstream struct {
	mu    sync.Mutex
	asked []string
	auth  []string // the Authorization headers /echo received
}

func (u *upstream) auths() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.auth...)
}

func (u *upstream) questions() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.asked...)
}

// served are the names the upstream serves: allowed.test over HTTPS
// with a bound secret, plain.test over HTTP, banner.test on bannerPorts.
func served(fqdn string) bool {
	return fqdn == "allowed.test." || fqdn == "plain.test." || fqdn == "banner.test."
}

// bannerPorts are ports other than 80 and 443 where the upstream speaks
// first, as SSH does, then echoes: the policy allows banner.test on the
// first only.
var bannerPorts = []int{2222, 2223}

// egress is the egress network's subnet in these tests: a documentation
// range, which the gate does not refuse (internal/policy/special.go), on
// a bridge the test's sandbox creates; .1 is the host's end.
var egress = netip.MustParsePrefix("198.51.100.0/24")

const hostEnd = "198.51.100.1"

// freebind lets the servers bind the bridge's address before moat has
// made the bridge.
func freebind(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_IP, 15 /* IP_FREEBIND */, 1) })
	if err != nil {
		return err
	}
	return serr
}

// inetLock is test/inet's host-wide lock: a test/inet Net routes the
// same documentation range into a namespace, so the two take turns.
const inetLock = "/run/moat-inet.lock"

// lockInet holds inetLock until the test's cleanup; it waits at most
// ten minutes for another test binary's Net to end.
func lockInet(t *testing.T) {
	f, err := os.OpenFile(inetLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	defer func() {
		if d := time.Since(start); d > time.Second {
			t.Logf("waited %s for %s", d.Round(time.Second), inetLock)
		}
	}()
	deadline := start.Add(10 * time.Minute)
	for syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		if time.Now().After(deadline) {
			f.Close()
			t.Fatalf("%s is held by another test for over ten minutes", inetLock)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Cleanup(func() { f.Close() })
}

// testCA makes a CA and a leaf for allowed.test: the upstream's
// certificate, which the gate verifies through [network] trust.
func testCA(t *testing.T) (caPEM []byte, leaf tls.Certificate) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "moat docker test CA"},
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
	l := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "allowed.test"}, DNSNames: []string{"allowed.test"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	lDER, err := x509.CreateCertificate(rand.Reader, l, ca, &lkey.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{lDER}, PrivateKey: lkey}
}

func startUpstream(t *testing.T, leaf tls.Certificate) *upstream {
	u := &upstream{}
	lc := net.ListenConfig{Control: freebind}
	ctx := context.Background()
	pc, err := lc.ListenPacket(ctx, "udp4", hostEnd+":53")
	if err != nil {
		t.Fatalf("listening for DNS on %s: %v", hostEnd, err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, qq := range q.Question {
			u.mu.Lock()
			u.asked = append(u.asked, qq.Name)
			u.mu.Unlock()
			if served(qq.Name) && qq.Qtype == dns.TypeA {
				rr, _ := dns.NewRR(qq.Name + " 60 IN A " + hostEnd)
				m.Answer = append(m.Answer, rr)
			}
		}
		if len(m.Answer) == 0 && !served(q.Question[0].Name) {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	l, err := lc.Listen(ctx, "tcp4", hostEnd+":80")
	if err != nil {
		t.Fatalf("listening for HTTP on %s: %v", hostEnd, err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/echo" {
			u.mu.Lock()
			u.auth = append(u.auth, r.Header.Get("Authorization"))
			u.mu.Unlock()
			fmt.Fprintf(w, "%s\n", r.Header.Get("Authorization"))
			return
		}
		fmt.Fprintf(w, "hello from %s\n", r.Host)
	}), ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })
	tl, err := lc.Listen(ctx, "tcp4", hostEnd+":443")
	if err != nil {
		t.Fatalf("listening for HTTPS on %s: %v", hostEnd, err)
	}
	hss := &http.Server{Handler: hs.Handler, ReadHeaderTimeout: 5 * time.Second}
	go hss.Serve(tls.NewListener(tl, &tls.Config{Certificates: []tls.Certificate{leaf}}))
	t.Cleanup(func() { hss.Close() })
	for _, port := range bannerPorts {
		bl, err := lc.Listen(ctx, "tcp4", fmt.Sprintf("%s:%d", hostEnd, port))
		if err != nil {
			t.Fatalf("listening on %s:%d: %v", hostEnd, port, err)
		}
		t.Cleanup(func() { bl.Close() })
		go func() {
			for {
				c, err := bl.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(10 * time.Second))
					fmt.Fprintf(c, "banner from %d\n", port)
					io.Copy(c, c)
				}()
			}
		}()
	}
	return u
}

// sandbox is one Docker sandbox of a test, in a workspace and MOAT_HOME
// of its own.
type sandbox struct {
	home      string // MOAT_HOME
	bin, ws   string
	env       []string
	name      string
	dc        *client.Client
	destroyed bool
}

// run is `moat run [args] -- argv` in the workspace; it returns stdout,
// stderr and the exit code.
func (s *sandbox) run(t *testing.T, timeout time.Duration, argv ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, append([]string{"run", "--trust-project", "--"}, argv...)...)
	cmd.Dir, cmd.Env = s.ws, s.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("moat run %v: %v\n%s", argv, err, errb.String())
	}
	if ctx.Err() != nil {
		t.Fatalf("moat run %v did not return within %s; stderr:\n%s", argv, timeout, errb.String())
	}
	return out.String(), errb.String(), code
}

// must is run expecting exit 0.
func (s *sandbox) must(t *testing.T, argv ...string) string {
	t.Helper()
	out, errs, code := s.run(t, 2*time.Minute, argv...)
	if code != 0 {
		t.Fatalf("moat run %q exited %d\nstdout:\n%s\nstderr:\n%s", argv, code, out, errs)
	}
	return out
}

func (s *sandbox) destroy(t *testing.T) {
	if s.destroyed {
		return
	}
	s.destroyed = true
	cmd := exec.Command(s.bin, "destroy", "--yes", s.name)
	cmd.Dir, cmd.Env = s.ws, s.env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("moat destroy: %v\n%s", err, out)
	}
}

// newSandbox makes a workspace for a Docker sandbox; its egress network
// is the documentation range, so it holds test/inet's lock until the
// sandbox is destroyed.
func newSandbox(t *testing.T, moatToml string, files map[string][]byte) *sandbox {
	ready(t)
	lockInet(t)
	bin, err := moatBin()
	if err != nil {
		t.Fatal(err)
	}
	dc, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	img := workloadImage(t, dc)
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	removeStale(t, dc)
	name := fmt.Sprintf("dk%06x", time.Now().UnixNano()&0xffffff)
	for f, b := range files {
		if err := os.WriteFile(filepath.Join(ws, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	toml := strings.NewReplacer("IMAGE", img, "NAME", name, "WS", ws).Replace(moatToml)
	if err := os.WriteFile(filepath.Join(ws, "moat.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &sandbox{home: filepath.Join(root, "home"), bin: bin, ws: ws, dc: dc, name: name,
		env: append(os.Environ(), "MOAT_HOME="+filepath.Join(root, "home"),
			"MOAT_DOCKER_EGRESS_SUBNET="+egress.String(), "MOAT_UPSTREAM_DNS="+hostEnd+":53")}
	t.Cleanup(func() { s.destroy(t) })
	return s
}

// removeStale removes what an earlier, killed run of these tests left
// in Docker (its sandboxes are named dk*): its egress network would hold
// the subnet this run needs.
func removeStale(t *testing.T, dc *client.Client) {
	ctx := context.Background()
	f := filters.NewArgs(filters.Arg("label", dockerrt.Label))
	cs, _ := dc.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	for _, c := range cs {
		if strings.HasPrefix(c.Labels[dockerrt.Label], "dk") {
			dc.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		}
	}
	ns, _ := dc.NetworkList(ctx, network.ListOptions{Filters: f})
	for _, n := range ns {
		if strings.HasPrefix(n.Labels[dockerrt.Label], "dk") {
			dc.NetworkRemove(ctx, n.ID)
		}
	}
	// Its INPUT rules for its bridge, by their comment.
	for _, tool := range []string{"iptables", "ip6tables"} {
		out, _ := exec.Command(tool, "-w", "-S", "INPUT").Output()
		for _, l := range strings.Split(string(out), "\n") {
			if !strings.Contains(l, "moat-dk") || !strings.HasPrefix(l, "-A INPUT ") {
				continue
			}
			args := append([]string{"-w", "-D", "INPUT"}, strings.Fields(strings.ReplaceAll(strings.TrimPrefix(l, "-A INPUT "), "\"", ""))...)
			exec.Command(tool, args...).Run()
		}
	}
}

var networkInspect = network.InspectOptions{}

type imageFile struct {
	name string // in the image, relative
	data []byte
}

// curlFiles are the host's curl, the libraries ldd finds for it and the
// dynamic loader, at the paths the loader searches in the image; none
// when the host has no curl (the HTTPS check then says so).
func curlFiles() []imageFile {
	bin, err := exec.LookPath("curl")
	if err != nil {
		return nil
	}
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil
	}
	files := []imageFile{{"usr/bin/curl", data}}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		var path string
		switch {
		case len(f) >= 3 && f[1] == "=>":
			path = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			path = f[0] // the loader
		default:
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		name := "lib/x86_64-linux-gnu/" + filepath.Base(path)
		if strings.Contains(path, "ld-linux") {
			name = "lib64/" + filepath.Base(path)
		}
		files = append(files, imageFile{name, b})
	}
	return files
}
