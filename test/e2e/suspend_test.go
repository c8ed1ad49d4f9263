package e2e

// moat suspend and moat resume through the real CLI, daemon and gVisor's
// checkpoint and restore: processes and their memory come back, on_up
// does not run again, forwards come back, attached sessions are ended
// and told why, and nothing of the sandbox runs while it is suspended.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/internal/testfs"
)

// suspendServer answers each GET with how many it has answered: state
// that lives in the process's memory only.
const suspendServer = `import http.server
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        n += 1
        b = str(n).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", %d), H).serve_forever()
`

const suspendGuestPort = 8124

// suspendToml starts the counter and the server from on_up, so a second
// run of on_up would show: a counter from 0, a server count from 1.
const suspendToml = `[hooks]
on_up = [
  "echo up >> .on-up-marker",
  "setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1",
  "setsid -f python3 server.py </dev/null >/dev/null 2>&1",
]
`

// suspendGuest is a running sandbox of suspendToml's: its counter read
// through exec, its server through a forward on hostPort.
type suspendGuest struct {
	dir, stateDir string
	hostPort      int
	counter       func() int
}

// startSuspendGuest starts one, checks the server's first answers (up
// to answered), and waits for the counter to pass 30: far enough from 0
// that a counter started again after a resume cannot have caught up by
// the time it is read.
func startSuspendGuest(t *testing.T, name string, answered int) suspendGuest {
	t.Helper()
	dir := project(t, name)
	os.Chmod(dir, 0o777)
	for f, body := range map[string]string{
		"moat.toml": suspendToml,
		"server.py": fmt.Sprintf(suspendServer, suspendGuestPort),
	} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g := suspendGuest{dir: dir, stateDir: filepath.Join(moatHome, "state", "sandboxes", name), hostPort: freePort(t)}
	mustMoat(t, dir, "up")
	mustMoat(t, dir, "forward", "add", name, fmt.Sprintf("%d:%d", g.hostPort, suspendGuestPort))
	for want := 1; want <= answered; want++ {
		if got := serverCount(t, g.hostPort, 10*time.Second); got != want {
			t.Fatalf("answer %d of the guest's server is %d", want, got)
		}
	}
	g.counter = func() int {
		t.Helper()
		out := strings.TrimSpace(mustMoat(t, dir, "exec", name, "--", "cat", "/tmp/count"))
		n, err := strconv.Atoi(out)
		if err != nil {
			t.Fatalf("the guest's counter reads %q", out)
		}
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for g.counter() < 30 {
		if time.Now().After(deadline) {
			t.Fatal("the guest's counter did not reach 30 in 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	return g
}

func TestSuspendResume(t *testing.T) {
	name := "suspend-e2e"
	// The server's first three answers, through the forward.
	g := startSuspendGuest(t, name, 3)
	dir, stateDir, hostPort, counter := g.dir, g.stateDir, g.hostPort, g.counter
	before := counter()

	// A session attached at the suspend: ended, and told why.
	attached := exec.Command(moatBin, "exec", name, "--", "sleep", "60")
	attached.Dir, attached.Env = dir, moatEnv(nil)
	var attachedErr strings.Builder
	attached.Stderr = &attachedErr
	if err := attached.Start(); err != nil {
		t.Fatal(err)
	}
	attachedDone := make(chan error, 1)
	go func() { attachedDone <- attached.Wait() }()
	t.Cleanup(func() { attached.Process.Kill() })
	waitSessions(t, dir, name, 1)

	r := moat(t, dir, nil, "suspend", name, "--json")
	if r.code != 0 {
		t.Fatalf("suspend: exit %d, stderr %q", r.code, r.stderr)
	}
	var res struct {
		State      string `json:"state"`
		ImageBytes int64  `json:"image_bytes"`
		Ended      int    `json:"sessions_ended"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.State != "suspended" || res.ImageBytes <= 0 || res.Ended != 1 {
		t.Fatalf("suspend --json = %q (%v); want state suspended, an image and one session ended", r.stdout, err)
	}

	t.Run("attached_session_ended_and_told", func(t *testing.T) {
		select {
		case err := <-attachedDone:
			if err == nil || !strings.Contains(attachedErr.String(), "suspended") || !strings.Contains(attachedErr.String(), "moat resume "+name) {
				t.Fatalf("the attached session ended with %v, stderr %q; want a failure that says the sandbox was suspended", err, attachedErr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the attached session was still running 30 s after the suspend")
		}
	})

	t.Run("nothing_runs_while_suspended", func(t *testing.T) {
		assertNothingLeft(t)
		var list struct {
			Sandboxes []struct {
				Name       string `json:"name"`
				State      string `json:"state"`
				ImageBytes int64  `json:"suspend_image_bytes"`
			} `json:"sandboxes"`
		}
		if err := json.Unmarshal([]byte(mustMoat(t, dir, "list", "--json")), &list); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, s := range list.Sandboxes {
			if s.Name == name {
				found = true
				if s.State != "suspended" || s.ImageBytes != res.ImageBytes {
					t.Errorf("list says %s with an image of %d bytes; want suspended, %d", s.State, s.ImageBytes, res.ImageBytes)
				}
			}
		}
		if !found {
			t.Fatalf("list has no %s", name)
		}
		if out := mustMoat(t, dir, "list"); !strings.Contains(out, "suspended (") {
			t.Errorf("list does not show the state with the image's size:\n%s", out)
		}
		img := filepath.Join(stateDir, "suspend")
		if fi, err := os.Stat(img); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("image directory: %v, %v; want mode 0700", fi, err)
		}
		ents, _ := os.ReadDir(img)
		if len(ents) == 0 {
			t.Fatal("the image directory is empty")
		}
		for _, e := range ents {
			if fi, _ := e.Info(); fi.Mode().Perm() != 0o600 {
				t.Errorf("%s has mode %v; want 0600 (it holds the guest's memory)", e.Name(), fi.Mode().Perm())
			}
		}
	})

	r = moat(t, dir, nil, "resume", name)
	if r.code != 0 {
		t.Fatalf("resume: exit %d, stderr %q", r.code, r.stderr)
	}

	t.Run("counter_continues", func(t *testing.T) {
		after := counter()
		if after < before {
			t.Fatalf("the counter reads %d after the resume, %d before the suspend: it started again", after, before)
		}
		later := after
		for i := 0; i < 50 && later == after; i++ {
			time.Sleep(100 * time.Millisecond)
			later = counter()
		}
		if later <= after {
			t.Fatalf("the counter stays at %d after the resume: the loop is not running", after)
		}
	})

	t.Run("server_keeps_its_state_through_the_forward", func(t *testing.T) {
		if got := serverCount(t, hostPort, 10*time.Second); got != 4 {
			t.Fatalf("the server's fourth answer is %d: its memory did not survive (or the forward did not come back)", got)
		}
	})

	t.Run("on_up_ran_once", func(t *testing.T) {
		b, _ := os.ReadFile(filepath.Join(dir, ".on-up-marker"))
		if n := strings.Count(string(b), "up\n"); n != 1 {
			t.Fatalf("on_up ran %d times; want once (the resume must not run it)", n)
		}
	})

	t.Run("image_gone_after_resume", func(t *testing.T) {
		if _, err := os.Stat(filepath.Join(stateDir, "suspend")); err == nil {
			t.Fatal("the image is still there after the guest ran on from it")
		}
	})

	t.Run("truncated_image_refused_files_kept", func(t *testing.T) {
		mustMoat(t, dir, "exec", name, "--", "sh", "-c", "echo kept > /tmp/kept")
		mustMoat(t, dir, "suspend", name)
		state := filepath.Join(stateDir, "suspend", "checkpoint.img")
		fi, err := os.Stat(state)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(state, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
		r := moat(t, dir, nil, "resume", name)
		if r.code == 0 || !strings.Contains(r.stderr, "could not be restored") || !strings.Contains(r.stderr, "moat up "+name) {
			t.Fatalf("resume from a truncated image: exit %d, stderr %q; want a refusal that says how to start afresh", r.code, r.stderr)
		}
		mustMoat(t, dir, "up", name)
		if out := strings.TrimSpace(mustMoat(t, dir, "exec", name, "--", "cat", "/tmp/kept")); out != "kept" {
			t.Fatalf("after the refused image and a fresh start, the guest's file reads %q", out)
		}
	})

	t.Run("daemon_killed_while_resuming_recovers_with_up", func(t *testing.T) {
		mustMoat(t, dir, "suspend", name)
		resume := exec.Command(moatBin, "resume", name)
		resume.Dir, resume.Env = dir, moatEnv(nil)
		if err := resume.Start(); err != nil {
			t.Fatal(err)
		}
		resumed := make(chan error, 1)
		go func() { resumed <- resume.Wait() }()
		t.Cleanup(func() { resume.Process.Kill() })
		killed := false
		for i := 0; i < 2000 && !killed; i++ {
			b, _ := os.ReadFile(filepath.Join(stateDir, "record.json"))
			var rec struct {
				State     string `json:"state"`
				DaemonPID int    `json:"daemon_pid"`
			}
			if json.Unmarshal(b, &rec) == nil && rec.State == "resuming" && rec.DaemonPID > 0 {
				killed = syscall.Kill(rec.DaemonPID, syscall.SIGKILL) == nil
			}
			time.Sleep(5 * time.Millisecond)
		}
		if !killed {
			t.Fatal("never saw the daemon resuming, within 10 s")
		}
		select {
		case <-resumed:
		case <-time.After(30 * time.Second):
			t.Fatal("moat resume did not return 30 s after its daemon was killed")
		}
		if st := sandboxState(t, dir, name, nil); st != "crashed" {
			t.Errorf("with its daemon killed while resuming, the sandbox is %q, want crashed", st)
		}
		mustMoat(t, dir, "up", name)
		mustMoat(t, dir, "exec", name, "--", "true")
		if st := sandboxState(t, dir, name, nil); st != "running" {
			t.Fatalf("after moat up the sandbox is %q", st)
		}
	})

	t.Run("idle_park_suspends_and_a_command_wakes_it", func(t *testing.T) {
		// Short idle knobs for every daemon of this subtest, the ones its
		// commands resume included: a fresh start, on_up and all.
		// A sample spans a whole second: the background counter below
		// runs two programs each second, and on a loaded host one such
		// burst can take more than a 200 ms sample's quarter of a core,
		// restarting the idle run each second (a CI run once never
		// parked with 200 ms samples).
		knobs := []string{"MOAT_IDLE_INTERVAL=1s", "MOAT_IDLE_TIMEOUT=3s"}
		run := func(args ...string) string {
			t.Helper()
			r := moat(t, dir, knobs, args...)
			if r.code != 0 {
				t.Fatalf("moat %v: exit %d, stderr %q", args, r.code, r.stderr)
			}
			return r.stdout
		}
		run("down", name)
		run("up", name)
		// A background process slow enough for the sandbox to count as
		// idle (on_up's fast counter is stopped), and not one on_up starts:
		// a cold start after the park would not bring it back.
		run("exec", name, "--", "sh", "-c",
			`pkill -f "/tmp/coun[t]; sleep 0.1"; setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/slow.new; mv /tmp/slow.new /tmp/slow; sleep 1; done' </dev/null >/dev/null 2>&1`)
		slow := func() int {
			t.Helper()
			out := strings.TrimSpace(run("exec", name, "--", "cat", "/tmp/slow"))
			n, err := strconv.Atoi(out)
			if err != nil {
				t.Fatalf("/tmp/slow reads %q", out)
			}
			return n
		}
		time.Sleep(1500 * time.Millisecond)
		before := slow()
		deadline := time.Now().Add(30 * time.Second)
		st := ""
		for time.Now().Before(deadline) {
			if st = sandboxState(t, dir, name, nil); st == "suspended" {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if st != "suspended" {
			log, _ := os.ReadFile(filepath.Join(stateDir, "daemon.log"))
			status := moat(t, dir, knobs, "status", name)
			t.Fatalf("not parked as suspended within 30 s of idleness: %s\nmoat status (its last idle sample):\n%s\n%s", st, status.stdout, log)
		}
		after := slow()
		if after < before {
			t.Fatalf("the background counter reads %d after the wake, %d before the park", after, before)
		}
		later := after
		for i := 0; i < 40 && later == after; i++ {
			time.Sleep(100 * time.Millisecond)
			later = slow()
		}
		if later <= after {
			t.Fatalf("the background counter stays at %d after the wake: the process did not survive the park", after)
		}
	})

	t.Run("destroy_removes_the_image", func(t *testing.T) {
		mustMoat(t, dir, "suspend", name)
		if _, err := os.Stat(filepath.Join(stateDir, "suspend")); err != nil {
			t.Fatalf("no image after the second suspend: %v", err)
		}
		mustMoat(t, dir, "destroy", "--yes", name)
		if _, err := os.Stat(stateDir); err == nil {
			t.Fatal("the sandbox's state, image included, is still there after destroy")
		}
		assertNothingLeft(t)
	})
}

// serverCount is the guest server's answer through the host port, retried
// until it answers or within runs out.
func serverCount(t *testing.T, port int, within time.Duration) int {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
			resp.Body.Close()
			n, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("the guest's server answered %q", b)
			}
			return n
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the guest's server did not answer through port %d within %v: %v", port, within, last)
	return 0
}

// waitSessions waits until the sandbox's status counts n sessions.
func waitSessions(t *testing.T, dir, name string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		var st struct {
			Sessions int `json:"sessions"`
		}
		if json.Unmarshal([]byte(moat(t, dir, nil, "status", name, "--json").stdout), &st) == nil && st.Sessions >= n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the sandbox did not count %d attached session(s) within 20 s", n)
}

// sandboxState is the sandbox's state as moat list --json says it.
func sandboxState(t *testing.T, dir, name string, env []string) string {
	t.Helper()
	var list struct {
		Sandboxes []struct {
			Name  string `json:"name"`
			State string `json:"state"`
		} `json:"sandboxes"`
	}
	json.Unmarshal([]byte(moat(t, dir, env, "list", "--json").stdout), &list)
	for _, s := range list.Sandboxes {
		if s.Name == name {
			return s.State
		}
	}
	return ""
}

// TestSuspendFullDisk: a checkpoint that runs out of disk leaves the
// sandbox running, its processes with it, and no image that could be
// taken for a whole one; with room again the suspend works.
func TestSuspendFullDisk(t *testing.T) {
	home := testfs.Small(t, "200m") // unmounted after the clean-up below
	name := "suspend-full"
	dir := project(t, name)
	os.Chmod(dir, 0o777)
	// disk = "unlimited": the writable layer in the state directory, not
	// an image the small filesystem has no room for.
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte("[sandbox]\ndisk = \"unlimited\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"MOAT_HOME=" + home}
	stateDir := filepath.Join(home, "state", "sandboxes", name)
	var filler string
	t.Cleanup(func() {
		if filler != "" {
			os.Remove(filler)
		}
		c := exec.Command(moatBin, "destroy", "--yes", name)
		c.Env = moatEnv(env)
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("destroy: %v\n%s", err, out)
		}
	})
	run := func(args ...string) result {
		t.Helper()
		return moat(t, dir, env, args...)
	}
	must := func(args ...string) string {
		t.Helper()
		r := run(args...)
		if r.code != 0 {
			t.Fatalf("moat %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
		return r.stdout
	}
	must("up")
	must("exec", name, "--", "sh", "-c", `setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.1; done' </dev/null >/dev/null 2>&1`)
	// One suspend and resume first: the guest then maps the moat binary
	// kept in the state directory, so the next suspend writes only the
	// image, and it is the image that meets the full disk.
	must("suspend", name)
	must("resume", name)
	counter := func() int {
		t.Helper()
		n, err := strconv.Atoi(strings.TrimSpace(must("exec", name, "--", "cat", "/tmp/c")))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := counter()

	// Full but for 1 MiB: the record's writes fit, the image does not.
	filler = testfs.Fill(t, home)
	if fi, err := os.Stat(filler); err != nil || os.Truncate(filler, fi.Size()-1<<20) != nil {
		t.Fatalf("making 1 MiB of room: %v", err)
	}
	r := run("suspend", name)
	if r.code == 0 || !strings.Contains(r.stderr, "no space left on device") || !strings.Contains(r.stderr, "keeps running") {
		t.Fatalf("suspend on a full disk: exit %d, stderr %q; want a failure that says the disk is full and the sandbox keeps running", r.code, r.stderr)
	}
	for _, d := range []string{"suspend", "suspend.new"} {
		if _, err := os.Stat(filepath.Join(stateDir, d)); err == nil {
			t.Errorf("%s is left after the failed suspend", d)
		}
	}
	if st := sandboxState(t, dir, name, env); st != "running" {
		t.Fatalf("after the failed suspend the sandbox is %s", st)
	}
	after := counter()
	later := after
	for i := 0; i < 40 && later == after; i++ {
		time.Sleep(100 * time.Millisecond)
		later = counter()
	}
	if after < before || later <= after {
		t.Fatalf("the guest's counter went %d, %d, %d across the failed suspend: its processes did not survive", before, after, later)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	filler = ""
	must("suspend", name)
	if st := sandboxState(t, dir, name, env); st != "suspended" {
		t.Fatalf("with room again, the suspend left the sandbox %s", st)
	}
}
