package docker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/dockerrt"
)

const forwardPolicy = `[sandbox]
name = "NAME"
image = "IMAGE"
runtime = "docker"

[forwards]
ports = ["HOSTPORT:8000"]
reverse = ["REVPORT:5432"]
`

// freePort is a TCP port of 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// hostServer serves body over HTTP on addr (a host address and port)
// until the test ends, and returns its port.
func hostServer(t *testing.T, addr, body string) int {
	t.Helper()
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, body) }),
		ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// moatCmd runs `moat args...` for the sandbox's workspace: stdout,
// stderr, exit code.
func (s *sandbox) moatCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, args...)
	cmd.Dir, cmd.Env = s.ws, s.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("moat %v: %v\n%s", args, err, errb.String())
	}
	return out.String(), errb.String(), code
}

// hostGet is GET http://127.0.0.1:port/index.html from the host, with a
// short deadline; the body, or the error.
func hostGet(port int) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/index.html", port))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestDockerForwards: [forwards] and `moat forward` on a Docker sandbox,
// both directions, live, and that they end with the workload.
func TestDockerForwards(t *testing.T) {
	hostPort := freePort(t)
	// The host's services: one the sandbox may reach through its
	// reverse forward, one on the loopback that it may not, and one on
	// every address of the host that it may not either.
	revPort := hostServer(t, "127.0.0.1:0", "reached-the-host-through-the-forward")
	closedPort := hostServer(t, "127.0.0.1:0", "must-stay-unreachable")
	anyPort := hostServer(t, "0.0.0.0:0", "must-stay-unreachable-too")
	toml := strings.NewReplacer("HOSTPORT", strconv.Itoa(hostPort), "REVPORT", strconv.Itoa(revPort)).Replace(forwardPolicy)
	s := newSandbox(t, toml, nil)
	token := fmt.Sprintf("served-by-the-workload-%d", time.Now().UnixNano())
	www := filepath.Join(s.ws, "www")
	if err := os.MkdirAll(www, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(www, "index.html"), []byte(token+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A web server in the workload, detached from the session, on every
	// address of the workload: busybox's httpd in the foreground.
	serve := fmt.Sprintf("setsid httpd -f -p %%d -h %s </dev/null >/dev/null 2>&1 &", www)
	s.must(t, "sh", "-c", fmt.Sprintf(serve, 8000)+" "+fmt.Sprintf(serve, 8001))
	// curl, not busybox's get, which crashes (SIGSEGV) on an answer here.
	get := func(url string) (string, int) {
		out, errs, code := s.run(t, time.Minute, "curl", "-sS", "-m", "5", url)
		return out + errs, code
	}
	// The workload's server needs a moment to listen: bounded.
	waitGet := func(port int) (string, error) {
		var body string
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if body, err = hostGet(port); err == nil && strings.Contains(body, token) {
				return body, nil
			}
		}
		return body, err
	}

	t.Run("host to guest from [forwards]", func(t *testing.T) {
		if body, err := waitGet(hostPort); err != nil || !strings.Contains(body, token) {
			t.Fatalf("GET 127.0.0.1:%d from the host: %q, %v; want the workload's page", hostPort, body, err)
		}
	})

	t.Run("guest to host from [forwards], and nothing else of the host", func(t *testing.T) {
		if out, code := get("http://10.88.0.1:5432/"); code != 0 || !strings.Contains(out, "reached-the-host-through-the-forward") {
			t.Errorf("get 10.88.0.1:5432 in the workload: exit %d, %q; want the host's server on 127.0.0.1:%d", code, out, revPort)
		}
		r, err := dockerrt.Load(filepath.Join(s.home, "state", "sandboxes", s.name))
		if err != nil {
			t.Fatal(err)
		}
		bridge := dockerrt.HostAt(r.Subnet, 1)
		for _, url := range []string{
			fmt.Sprintf("http://10.88.0.1:%d/", closedPort),
			fmt.Sprintf("http://10.88.0.1:%d/", anyPort),
			fmt.Sprintf("http://10.88.0.1:%d/", revPort),
			fmt.Sprintf("http://%s:%d/", bridge, anyPort),
			fmt.Sprintf("http://%s:%d/", bridge, closedPort),
		} {
			if out, code := get(url); code == 0 || strings.Contains(out, "unreachable") {
				t.Errorf("get %s in the workload: exit %d, %q; want it refused", url, code, out)
			}
		}
	})

	t.Run("every forward connection and refusal is audited", func(t *testing.T) {
		r, err := dockerrt.Load(filepath.Join(s.home, "state", "sandboxes", s.name))
		if err != nil {
			t.Fatal(err)
		}
		path := dockerrt.ForwardAuditPath(filepath.Join(s.home, "state", "sandboxes", s.name))
		wants := []struct {
			what string
			ok   func(audit.Record) bool
		}{
			{"the host's GET through the forward to guest port 8000", func(rec audit.Record) bool {
				return rec.Verdict == audit.Allow && rec.Reason == audit.ReasonForward && rec.Dst == fmt.Sprintf("%s:8000", r.WorkloadIP) &&
					rec.Rule == fmt.Sprintf("forward %d:8000", hostPort) && rec.BytesDown > 0 && rec.BytesUp > 0
			}},
			{"the workload's connection to 10.88.0.1:5432", func(rec audit.Record) bool {
				return rec.Verdict == audit.Allow && rec.Reason == audit.ReasonReverseForward && rec.Dst == "10.88.0.1:5432" &&
					rec.Upstream == fmt.Sprintf("127.0.0.1:%d", revPort) && rec.BytesUp > 0 && rec.BytesDown > 0
			}},
			{"the refused 10.88.0.1:" + strconv.Itoa(closedPort), func(rec audit.Record) bool {
				return rec.Verdict == audit.Deny && rec.Dst == fmt.Sprintf("10.88.0.1:%d", closedPort) &&
					strings.Contains(string(rec.Reason), fmt.Sprintf("gateway port %d is not a reverse forward", closedPort))
			}},
		}
		for _, want := range wants {
			var n int
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				n = 0
				audit.Read(path, func(rec audit.Record) bool {
					if rec.Sandbox == s.name && want.ok(rec) {
						n++
					}
					return true
				})
				if n > 0 {
					break
				}
			}
			if n == 0 {
				b, _ := os.ReadFile(path)
				t.Errorf("no audit record of %s in %s:\n%s", want.what, path, b)
			}
		}

		// What a person types: the forwarder's records among the gate
		// container's, and its refusal among the denials.
		out, errs, code := s.moatCmd(t, "network", "audit", s.name, "--json")
		if code != 0 {
			t.Fatalf("moat network audit --json: exit %d\n%s", code, errs)
		}
		var shown []audit.Record
		for line := range strings.Lines(out) {
			if strings.TrimSpace(line) == "" {
				continue
			}
			var rec audit.Record
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("moat network audit --json: %v in %q", err, line)
			}
			shown = append(shown, rec)
		}
		for _, want := range wants {
			if !slices.ContainsFunc(shown, want.ok) {
				t.Errorf("moat network audit %s --json shows no record of %s:\n%s", s.name, want.what, out)
			}
		}
		refusedDst := fmt.Sprintf("10.88.0.1:%d", closedPort)
		if out, errs, code := s.moatCmd(t, "network", "audit", s.name); code != 0 || !strings.Contains(out, refusedDst) {
			t.Errorf("moat network audit %s: exit %d, stdout:\n%s\nstderr: %s\nwant the refused %s", s.name, code, out, errs, refusedDst)
		}
		out, errs, code = s.moatCmd(t, "network", "denials", s.name, "--json")
		var denials struct {
			Sandboxes []control.Denials `json:"sandboxes"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &denials) != nil || len(denials.Sandboxes) != 1 ||
			!slices.ContainsFunc(denials.Sandboxes[0].Entries, func(e audit.Entry) bool { return e.Dest == refusedDst && e.Count > 0 }) {
			t.Errorf("moat network denials %s --json: exit %d, stdout:\n%s\nstderr: %s\nwant %s denied", s.name, code, out, errs, refusedDst)
		}

		// -f: the history of both logs, then what the forwarder adds.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		follow := exec.CommandContext(ctx, s.bin, "network", "audit", s.name, "-f", "--json")
		follow.Dir, follow.Env = s.ws, s.env
		stdout, err := follow.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		defer follow.Wait()
		defer follow.Process.Kill()
		lines := make(chan audit.Record, 100)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var rec audit.Record
				if json.Unmarshal(sc.Bytes(), &rec) == nil {
					lines <- rec
				}
			}
		}()
		// A port refused after -f started: a record of the forwarder's
		// that only following can show.
		laterPort := freePort(t)
		laterDst := fmt.Sprintf("10.88.0.1:%d", laterPort)
		var sawHistory, sawLater, asked bool
		for !sawLater {
			select {
			case rec, ok := <-lines:
				if !ok {
					t.Fatalf("moat network audit -f ended (history seen: %v) before showing %s", sawHistory, laterDst)
				}
				sawHistory = sawHistory || wants[len(wants)-1].ok(rec) // the refusal, the latest of them
				sawLater = rec.Dst == laterDst && rec.Verdict == audit.Deny
			case <-time.After(time.Second):
				// Once it has shown the history, so that the new
				// record is one it followed.
				if sawHistory && !asked {
					get(fmt.Sprintf("http://%s/", laterDst))
					asked = true
				}
			}
		}
		if !sawHistory {
			t.Errorf("moat network audit -f showed %s before the earlier refusal of %s", laterDst, refusedDst)
		}
	})

	var liveHost int
	t.Run("moat forward add and remove, live", func(t *testing.T) {
		liveHost = freePort(t)
		if _, errs, code := s.moatCmd(t, "forward", "add", s.name, fmt.Sprintf("%d:8001", liveHost)); code != 0 {
			t.Fatalf("moat forward add: exit %d\n%s", code, errs)
		}
		if body, err := waitGet(liveHost); err != nil {
			t.Errorf("GET 127.0.0.1:%d after moat forward add: %q, %v", liveHost, body, err)
		}
		if _, errs, code := s.moatCmd(t, "forward", "add", "--reverse", s.name, fmt.Sprintf("%d:6000", closedPort)); code != 0 {
			t.Fatalf("moat forward add --reverse: exit %d\n%s", code, errs)
		}
		if out, code := get("http://10.88.0.1:6000/"); code != 0 || !strings.Contains(out, "must-stay-unreachable") {
			t.Errorf("get 10.88.0.1:6000 after moat forward add --reverse: exit %d, %q", code, out)
		}
		out, errs, code := s.moatCmd(t, "forward", "list", "--json", s.name)
		if code != 0 {
			t.Fatalf("moat forward list: exit %d\n%s", code, errs)
		}
		var fs control.Forwards
		if err := json.Unmarshal([]byte(out), &fs); err != nil {
			t.Fatalf("moat forward list --json: %v\n%s", err, out)
		}
		want := map[string]string{
			fmt.Sprintf("127.0.0.1:%d", hostPort): "listening", fmt.Sprintf("127.0.0.1:%d", liveHost): "listening",
			"10.88.0.1:5432": "open", "10.88.0.1:6000": "open",
		}
		got := map[string]string{}
		for _, f := range fs.Forwards {
			got[f.Listen] = f.Status
		}
		for l, st := range want {
			if got[l] != st {
				t.Errorf("moat forward list: %s is %q; want %q (all: %v)", l, got[l], st, got)
			}
		}
		if _, errs, code := s.moatCmd(t, "forward", "remove", "--reverse", s.name, "6000"); code != 0 {
			t.Fatalf("moat forward remove --reverse: exit %d\n%s", code, errs)
		}
		if out, code := get("http://10.88.0.1:6000/"); code == 0 {
			t.Errorf("get 10.88.0.1:6000 after moat forward remove --reverse: exit 0, %q; want it refused", out)
		}
	})

	t.Run("a host port in use is refused and not kept", func(t *testing.T) {
		busy, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		port := busy.Addr().(*net.TCPAddr).Port
		_, errs, code := s.moatCmd(t, "forward", "add", s.name, fmt.Sprintf("%d:8000", port))
		if code != 2 || !strings.Contains(errs, "already in use") {
			t.Errorf("moat forward add on a busy port: exit %d\n%s\nwant exit 2 saying it is in use", code, errs)
		}
		out, _, _ := s.moatCmd(t, "forward", "list", s.name)
		if strings.Contains(out, strconv.Itoa(port)) {
			t.Errorf("the refused forward is listed:\n%s", out)
		}
	})

	dir := filepath.Join(s.home, "state", "sandboxes", s.name)
	t.Run("the forwards end with the workload and come back with it", func(t *testing.T) {
		if !dockerrt.ForwarderAlive(dir) {
			t.Fatal("no forwarder holds the lock while the sandbox runs")
		}
		if _, errs, code := s.moatCmd(t, "down", s.name); code != 0 {
			t.Fatalf("moat down: exit %d\n%s", code, errs)
		}
		deadline := time.Now().Add(10 * time.Second)
		for dockerrt.ForwarderAlive(dir) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if dockerrt.ForwarderAlive(dir) {
			t.Fatal("the forwarder still runs 10 s after moat down")
		}
		for _, p := range []int{hostPort, liveHost} {
			if c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", p), time.Second); err == nil {
				c.Close()
				t.Errorf("host port %d still accepts after moat down", p)
			}
		}
		out, _, _ := s.moatCmd(t, "forward", "list", s.name)
		if !strings.Contains(out, "stopped") {
			t.Errorf("moat forward list of the stopped sandbox:\n%s\nwant its forwards stopped", out)
		}
		s.must(t, "sh", "-c", fmt.Sprintf(serve, 8000)+" "+fmt.Sprintf(serve, 8001))
		for _, p := range []int{hostPort, liveHost} {
			if body, err := waitGet(p); err != nil {
				t.Errorf("GET 127.0.0.1:%d after the next start: %q, %v", p, body, err)
			}
		}
		if out, code := get("http://10.88.0.1:5432/"); code != 0 || !strings.Contains(out, "reached-the-host-through-the-forward") {
			t.Errorf("get 10.88.0.1:5432 after the next start: exit %d, %q", code, out)
		}
	})
}
