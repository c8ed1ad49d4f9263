package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPrivilegeSeparation: of a running sandbox's moat processes, the one
// that reads the guest's bytes (the gate process) runs as a uid of its
// own with no capabilities, no_new_privs and a seccomp filter on every
// thread; the privileged ones (the keeper, the shim) hold no
// descriptor the guest's bytes arrive on; and from inside the gate
// process, a test build's escape attempts all fail while it goes on
// serving the guest.
func TestPrivilegeSeparation(t *testing.T) {
	dir := project(t, "privsep")
	other := project(t, "privsep2")
	mustMoat(t, dir, "up")
	mustMoat(t, other, "up")
	state := filepath.Join(moatHome, "state", "sandboxes", "privsep")
	otherState := filepath.Join(moatHome, "state", "sandboxes", "privsep2")

	keeper := sandboxDaemon(t, "privsep")
	procs := processTree(keeper)
	var gate, shim int
	for _, p := range procs {
		switch args := cmdline(p); {
		case len(args) > 1 && args[1] == "__gate":
			gate = p
		case len(args) > 1 && args[1] == "__shim":
			shim = p
		}
	}
	if gate == 0 || shim == 0 {
		t.Fatalf("no gate process or shim under the keeper %d: %v", keeper, procs)
	}

	t.Run("gate_process_jailed", func(t *testing.T) {
		tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(gate), "task", "*", "status"))
		if len(tasks) == 0 {
			t.Fatal("no threads of the gate process")
		}
		uids := map[string]bool{}
		for _, f := range tasks {
			st := procStatus(t, f)
			for _, k := range []string{"Uid", "Gid"} {
				for _, id := range strings.Fields(st[k]) {
					if id == "0" {
						t.Errorf("%s: %s %s", f, k, st[k])
					}
				}
			}
			uids[strings.Fields(st["Uid"])[0]] = true
			for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
				if st[k] != "0000000000000000" {
					t.Errorf("%s: %s %s", f, k, st[k])
				}
			}
			if st["NoNewPrivs"] != "1" || st["Seccomp"] != "2" {
				t.Errorf("%s: NoNewPrivs %s Seccomp %s", f, st["NoNewPrivs"], st["Seccomp"])
			}
		}
		// A uid of its own: not the other sandbox's gate's.
		otherGate := 0
		for _, p := range processTree(sandboxDaemon(t, "privsep2")) {
			if a := cmdline(p); len(a) > 1 && a[1] == "__gate" {
				otherGate = p
			}
		}
		if otherGate == 0 {
			t.Fatal("no gate process in the other sandbox")
		}
		st := procStatus(t, filepath.Join("/proc", strconv.Itoa(otherGate), "status"))
		if uids[strings.Fields(st["Uid"])[0]] {
			t.Errorf("two sandboxes' gate processes share uid %s", st["Uid"])
		}
	})

	t.Run("privileged_hold_no_guest_fd", func(t *testing.T) {
		unixSocks := unixInodes(t)
		checked := 0
		for _, p := range procs {
			if p == gate || !isMoat(p) {
				continue // runsc's own processes, and the jailed one
			}
			checked++
			fds, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(p), "fd", "*"))
			for _, fd := range fds {
				target, err := os.Readlink(fd)
				if err != nil {
					continue
				}
				if strings.Contains(target, "tun") {
					t.Errorf("%v (pid %d) holds the TAP device: %s -> %s", cmdline(p), p, fd, target)
				}
				if ino, ok := strings.CutPrefix(target, "socket:["); ok && !unixSocks[strings.TrimSuffix(ino, "]")] {
					t.Errorf("%v (pid %d) holds a network socket: %s -> %s", cmdline(p), p, fd, target)
				}
			}
		}
		// The keeper and the shim at least: a test that looked at no
		// process would prove nothing.
		if checked < 2 {
			t.Fatalf("looked at %d of moat's privileged processes among %v; want the keeper and the shim", checked, procs)
		}
	})

	t.Run("escape_attempts_fail", func(t *testing.T) {
		targets := map[string]any{
			"ReadFiles": []string{"/etc/shadow", "/etc/passwd", filepath.Join(state, "record.json"),
				filepath.Join(otherState, "record.json"), filepath.Join(state, "ca-key.pem"), filepath.Join(state, "client_key")},
			"WriteDirs":   []string{"/usr", "/", state, filepath.Join(state, "guest")},
			"UnixSockets": []string{filepath.Join(otherState, "control.sock"), filepath.Join(state, "control.sock")},
			"PIDs":        []int{keeper, shim, sandboxDaemon(t, "privsep2")},
			"Execs":       []string{"/bin/sh"},
		}
		var results []struct{ Name, Error string }
		controlPost(t, filepath.Join(state, "control.sock"), "/v1/test/escape", targets, &results)
		if len(results) < 20 {
			t.Fatalf("only %d attempts reported: %v", len(results), results)
		}
		for _, r := range results {
			if r.Error == "" {
				t.Errorf("escape attempt succeeded: %s", r.Name)
			} else {
				t.Logf("%s: %s", r.Name, r.Error)
			}
		}
		// The gate process still serves the guest: a session over
		// its netstack, and the guest's DNS through its gate.
		out := mustMoat(t, dir, "run", "--", "sh", "-c", "echo still-serving")
		if !strings.Contains(out, "still-serving") {
			t.Fatalf("after the attempts: %q", out)
		}
	})
}

func cmdline(pid int) []string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// isMoat reports whether pid runs one of the moat binaries under test.
func isMoat(pid int) bool {
	exe, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
	return isMoatExe(exe)
}

// isMoatExe reports whether exe is moat or the moat-sandbox beside it,
// which a sandbox's keeper, gate process and shim run.
func isMoatExe(exe string) bool {
	bin, _ := filepath.EvalSymlinks(moatBin)
	return exe != "" && (exe == bin || exe == filepath.Join(filepath.Dir(bin), "moat-sandbox"))
}

func procStatus(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// unixInodes are the inodes of the host's unix sockets.
func unixInodes(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 6 {
			out[f[6]] = true
		}
	}
	return out
}

// controlPost posts in as JSON to a sandbox's control socket and decodes
// the answer into out.
func controlPost(t *testing.T, sock, path string, in, out any) {
	t.Helper()
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	b, _ := json.Marshal(in)
	resp, err := c.Post("http://moat"+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s (a build without -tags moattest has no such route)", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}
