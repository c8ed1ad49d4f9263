package rootless

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/lockdown"
	"moat.dev/moat/test/inet"
)

// TestRootlessMoat runs the moat binary as an ordinary user, exactly as
// that user would type it, with no sudo, on a host set up as an
// administrator would (setupHost) and behind a test internet (startWorld):
// doctor finds every prerequisite; a sandbox starts with its jailed gate
// process; what the agent writes in the workspace belongs to the user;
// run and exec pass exit codes on; a shell works through a terminal;
// forwards work both ways; the gate keeps a denied name on the host,
// refuses internal addresses and swaps a bound secret's placeholder for
// its value; down and up keep the writable layer; the missing limits are
// said plainly; destroy removes the state dir the namespace's ids own and
// leaves no mount, namespace or process behind; an explicit disk limit is
// refused.
func TestRootlessMoat(t *testing.T) {
	h := setupHost(t)
	u := h.user
	home := mkdirOwned(t, h.base, "home", u)
	ws := mkdirOwned(t, h.base, "ws", u)
	w := startWorld(t, ws, u)
	m := &moatUser{h: h, bin: moatBinary(t, h.base), home: home, env: w.env()}
	moat := m.run
	state := filepath.Join(home, "state", "sandboxes", "ws")
	t.Cleanup(func() {
		moat(t, ws, "destroy", "--yes", "ws")
		waitNoProcs(t, h)
	})

	// Where cgroup v1 is mounted, as here, a user can write no cgroup.
	_, v2err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	noLimits := v2err != nil

	out, _, code := moat(t, ws, "doctor")
	if code != 0 {
		t.Fatalf("moat doctor as %s: exit %d\n%s", u.name, code, out)
	}
	for _, want := range []string{"ok   user namespaces", "ok   /etc/subuid", "ok   newuidmap", "ok   overlay in a user namespace", "note disk limits"} {
		if !strings.Contains(out, want) {
			t.Errorf("moat doctor's output lacks %q:\n%s", want, out)
		}
	}
	if noLimits && !strings.Contains(out, "note resource limits: none") {
		t.Errorf("moat doctor does not say there are no resource limits:\n%s", out)
	}

	// The project's network rules and secret need the user's consent: on
	// no terminal, --trust-project at create.
	stdout, stderr, code := moat(t, ws, "run", "--trust-project", "--", "sh", "-c", "echo hi > f && id -u")
	if code != 0 {
		t.Fatalf("moat run as %s: exit %d\nstdout: %s\nstderr: %s\ndaemon.log:\n%s", u.name, code, stdout, stderr, readLog(home))
	}
	if got := strings.TrimSpace(stdout); got != strconv.Itoa(int(u.uid)) {
		t.Errorf("the agent's uid in the guest = %q, want the user's %d", got, u.uid)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "f")); err != nil || string(b) != "hi\n" {
		t.Errorf("the agent's file: %q, %v", b, err)
	}
	if got := owner(t, filepath.Join(ws, "f")); got != u.uid {
		t.Errorf("the agent's file belongs to %s on the host, want the user %d", ownerString(got), u.uid)
	}
	// The first line after the sandbox's creation: the start's.
	lines := strings.Split(stderr, "\n")
	if strings.HasPrefix(lines[0], "moat: created sandbox") {
		lines = lines[1:]
	}
	if first := lines[0]; noLimits && !strings.Contains(first, "no resource limits") {
		t.Errorf("the start's first line %q does not say the sandbox has no resource limits", first)
	}

	// The gate process: jailed, as the user.
	gates := h.procs("__gate")
	if len(gates) != 1 {
		t.Fatalf("gate processes of the user: %v, want one", gates)
	}
	if err := lockdown.Verify(gates[0].pid, lockdown.Config{UID: int(u.uid), GID: int(u.gid)}); err != nil {
		t.Errorf("the rootless gate process is not jailed as the user: %v", err)
	}

	t.Run("exit_codes", func(t *testing.T) {
		if so, se, code := moat(t, ws, "run", "--", "sh", "-c", "echo out; exit 7"); code != 7 || so != "out\n" {
			t.Errorf("moat run -- sh -c 'echo out; exit 7': exit %d, stdout %q, want 7 and \"out\\n\"; stderr: %s", code, so, se)
		}
		// 128+N for a command killed by signal N (moat help exit-codes);
		// 127 for one the guest cannot find, as a shell says.
		for _, c := range []struct {
			args []string
			want int
		}{
			{[]string{"sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM)},
			{[]string{"moat-rootless-no-such-command"}, 127},
		} {
			if _, se, code := moat(t, ws, append([]string{"run", "--"}, c.args...)...); code != c.want {
				t.Errorf("moat run -- %q: exit %d, want %d; stderr: %s", c.args, code, c.want, se)
			}
		}
		// exec names the sandbox and runs from anywhere: here a directory
		// that is not the workspace.
		d := filepath.Join(ws, "d")
		so, se, code := moat(t, h.base, "exec", "ws", "--", "sh", "-c", "id -u; cat "+filepath.Join(ws, "f")+"; mkdir "+d+" && echo g > "+d+"/g; exit 5")
		if want := fmt.Sprintf("%d\nhi\n", u.uid); code != 5 || so != want {
			t.Errorf("moat exec ws -- ...; exit 5: exit %d, stdout %q, want 5 and %q; stderr: %s", code, so, se, want)
		}
		for _, p := range []string{d, filepath.Join(d, "g")} {
			if got := owner(t, p); got != u.uid {
				t.Errorf("%s, made by exec, belongs to %s on the host, want the user %d", p, ownerString(got), u.uid)
			}
		}
	})

	t.Run("shell_through_a_terminal", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := m.command(ctx, ws, "shell")
		cmd.Env = append(cmd.Env, "TERM=xterm")
		term := startTerminal(t, cmd, u)
		defer term.f.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// The typed line echoes "UID=/'", never "UID=" and a digit.
		term.f.Write([]byte("id -u | sed 's/^/UID=/'; tty | sed 's/^/TTY=/'\n"))
		term.WaitFor(t, "TTY=/dev/pts/", 30*time.Second)
		term.WaitFor(t, fmt.Sprintf("UID=%d", u.uid), 5*time.Second)
		// A resize reaches the guest's terminal; Ctrl-C interrupts the
		// guest's command, not the session.
		if err := pty.Setsize(term.f, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
			t.Fatal(err)
		}
		term.SendUntil(t, term.f, []byte("stty size | sed 's/^/SIZE=/'\n"), "SIZE=40 100", 10*time.Second)
		// Had Ctrl-C not interrupted sleep, the echo typed after it would
		// run when sleep ends, 30 s later, past SendUntil's bound.
		term.f.Write([]byte("sleep 30\n"))
		time.Sleep(500 * time.Millisecond)
		term.SendUntil(t, term.f, []byte("\x03echo ALIVE-$((40+2))\n"), "ALIVE-42", 15*time.Second)
		term.f.Write([]byte("exit 3\n"))
		select {
		case err := <-done:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 3 {
				t.Errorf("the shell's end: %v, want exit status 3; the terminal showed:\n%s", err, term.Shown())
			}
		case <-ctx.Done():
			t.Errorf("the shell did not exit after exit 3; the terminal showed:\n%s", term.Shown())
		}
	})

	t.Run("forwards_both_ways", func(t *testing.T) {
		const guestPort, gatewayPort = 8123, 5544
		// A server in the guest, detached from the session, serving the workspace.
		serve := fmt.Sprintf(`setsid -f python3 -m http.server %d --bind 0.0.0.0 --directory %s >/dev/null 2>&1
for i in $(seq 1 100); do
  python3 -c 'import socket; socket.create_connection(("127.0.0.1", %d), 1)' 2>/dev/null && { echo up; exit 0; }
  sleep 0.1
done
echo down`, guestPort, ws, guestPort)
		if so, se, code := moat(t, ws, "run", "--", "sh", "-c", serve); code != 0 || strings.TrimSpace(so) != "up" {
			t.Fatalf("the guest's server: exit %d, %q; stderr: %s", code, so, se)
		}
		hostPort := freePort(t)
		if _, se, code := moat(t, ws, "forward", "add", "ws", fmt.Sprintf("%d:%d", hostPort, guestPort)); code != 0 {
			t.Fatalf("moat forward add ws %d:%d: exit %d: %s", hostPort, guestPort, code, se)
		}
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/f", hostPort))
		if err != nil {
			t.Fatalf("host → guest through 127.0.0.1:%d: %v", hostPort, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "hi\n" {
			t.Errorf("host → guest through 127.0.0.1:%d: %s %q, want 200 and the workspace's f", hostPort, resp.Status, b)
		}

		served := hostServer(t, "127.0.0.1", "moat-reverse-ok")
		if _, se, code := moat(t, ws, "forward", "add", "--reverse", "ws", fmt.Sprintf("%d:%d", served.port, gatewayPort)); code != 0 {
			t.Fatalf("moat forward add --reverse ws %d:%d: exit %d: %s", served.port, gatewayPort, code, se)
		}
		// The listed gateway port reaches the host's server; the port of
		// another server on the host's loopback is refused.
		py := `import socket, sys
for p in sys.argv[1:]:
    try:
        s = socket.create_connection(("` + gatewayIP + `", int(p)), 3)
        s.settimeout(3)
        print(p, "OK", s.makefile().readline().strip())
    except ConnectionRefusedError:
        print(p, "refused")
    except Exception as e:
        print(p, type(e).__name__)
`
		so, se, code := moat(t, ws, "run", "--", "python3", "-c", py, strconv.Itoa(gatewayPort), strconv.Itoa(w.loopback.port))
		want := fmt.Sprintf("%d OK moat-reverse-ok\n%d refused\n", gatewayPort, w.loopback.port)
		if code != 0 || so != want {
			t.Errorf("guest → host: exit %d, got:\n%swant:\n%sstderr: %s", code, so, want, se)
		}
		if n := served.accepts.Load(); n != 1 {
			t.Errorf("the reverse forward's host server accepted %d connections, want 1", n)
		}
		if n := w.loopback.accepts.Load(); n != 0 {
			t.Errorf("an unlisted port of the host's 127.0.0.1 accepted %d connections from the guest", n)
		}
	})

	t.Run("gate", func(t *testing.T) {
		script := fmt.Sprintf(`o=$(mktemp -d)
c() {
  k=$1; shift
  echo "$k=$(curl -sS --max-time 5 -D $o/$k.h -o $o/$k -w '%%{http_code}' "$@" 2>/dev/null; echo " rc=$?")"
  echo "${k}_BY_GATE=$(grep -ci '^x-moat-denied:' $o/$k.h)"
}
c ALLOWED http://allowed.test/
c DENIED http://denied.test/
c LAN http://lan.test/
c LANIP http://%[1]s/
c LOOPBACK http://%[2]s:%[3]d/
c HOSTIP http://%[4]s:%[5]d/
# Around the gate's resolver: a question straight to the test internet's DNS server.
echo "DIRECT_DNS=$(python3 -c '
import socket
q = bytes.fromhex("abcd01000001000000000000") + b"\x06denied\x04test\x00\x00\x01\x00\x01"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
try:
    s.sendto(q, ("%[6]s", 53))
    print("answered", len(s.recv(512)))
except Exception as e:
    print(type(e).__name__)
' 2>&1)"
echo "PH=$MOAT_TOKEN"
c SECRET -H "Authorization: Bearer $MOAT_TOKEN" https://up.test/echo
echo "SECRET_BODY=$(tr -d '\n' < $o/SECRET)"
`, lanIP, gatewayIP, w.loopback.port, w.hostIP, w.lanIf.port, inet.DNSAddr.Addr())
		so, se, code := moat(t, ws, "run", "--", "sh", "-c", script)
		if code != 0 {
			t.Fatalf("the guest's attempts: exit %d\nstdout: %s\nstderr: %s", code, so, se)
		}
		t.Logf("guest:\n%s", so)
		f := fields(so)
		if !strings.HasPrefix(f["ALLOWED"], "200 ") || w.allowed.Hits() == 0 {
			t.Errorf("the positive control: allowed.test gave %q, its server had %d requests; want 200 and one", f["ALLOWED"], w.allowed.Hits())
		}
		// Refused: no connection, no answer, or the gate's own 403 page.
		for _, k := range []string{"DENIED", "LAN", "LANIP", "LOOPBACK", "HOSTIP"} {
			byGate := strings.HasPrefix(f[k], "403 ") && f[k+"_BY_GATE"] == "1"
			if strings.HasSuffix(f[k], " rc=0") && !byGate {
				t.Errorf("%s: the guest got %q, want a refusal", k, f[k])
			}
		}
		// A denied name never leaves the host: the test's DNS server was
		// asked only about names the policy allows, never denied.test.
		if n := w.net.Asked("denied.test"); n != 0 {
			t.Errorf("the upstream DNS server was asked about denied.test %d times: a denied name left the host", n)
		}
		for _, q := range w.net.Queries() {
			name, _, _ := strings.Cut(q, " ")
			if name != "allowed.test" && name != "up.test" && name != "lan.test" {
				t.Errorf("the upstream DNS server was asked %q: only names the policy allows may leave the host", q)
			}
		}
		for what, n := range map[string]int{
			"denied.test's server":                      w.denied.Conns(),
			"lan.test's server (" + lanIP + ")":         w.lan.Conns(),
			"the host's 127.0.0.1 server":               int(w.loopback.accepts.Load()),
			"the host's LAN address (" + w.hostIP + ")": int(w.lanIf.accepts.Load()),
		} {
			if n != 0 {
				t.Errorf("%s accepted %d connections from the guest", what, n)
			}
		}
		// Each refusal is in the audit log, written by the jailed gate
		// process as the user.
		for _, name := range []string{"denied.test", "lan.test"} {
			if !auditDenied(t, state, name) {
				t.Errorf("no deny record for %s in %s within %v", name, filepath.Join(state, "audit"), auditWait)
			}
		}
		// The bound secret: the guest holds a placeholder, the upstream
		// receives the value, and the value never comes back in.
		if ph := f["PH"]; !strings.HasPrefix(ph, "moat-ph-") || strings.Contains(ph, w.token) {
			t.Errorf("the guest's MOAT_TOKEN is %q, want a placeholder", ph)
		}
		if !strings.HasPrefix(f["SECRET"], "200 ") {
			t.Errorf("the request to up.test: %q, want 200", f["SECRET"])
		}
		var got []string
		for _, r := range w.up.Requests() {
			got = append(got, r.Header.Get("Authorization"))
		}
		if len(got) != 1 || got[0] != "Bearer "+w.token {
			t.Errorf("up.test received Authorization %q, want once the secret's value (the guest sent %q)", got, "Bearer "+f["PH"])
		}
		if strings.Contains(so, w.token) {
			t.Errorf("the secret's value reached the guest:\n%s", so)
		}
	})

	status, _, code := moat(t, ws, "status")
	if code != 0 || (noLimits && !strings.Contains(status, "limits:     none")) {
		t.Errorf("moat status: exit %d, does not say there are no limits:\n%s", code, status)
	}
	status, _, code = moat(t, ws, "status", "--json")
	if code != 0 || (noLimits && !strings.Contains(status, `"no_limits":"cgroup v1`)) {
		t.Errorf("moat status --json: exit %d, has no no_limits:\n%s", code, status)
	}

	t.Run("down_up_keeps_the_writable_layer", func(t *testing.T) {
		write := `echo kept > /var/tmp/keep && echo kept > "$HOME/keep" && cat /var/tmp/keep "$HOME/keep"`
		if so, se, code := moat(t, ws, "run", "--", "sh", "-c", write); code != 0 || so != "kept\nkept\n" {
			t.Fatalf("writing /var/tmp/keep and ~/keep in the guest: exit %d, stdout %q\nstderr: %s", code, so, se)
		}
		if _, se, code := moat(t, ws, "down"); code != 0 {
			t.Fatalf("moat down: exit %d: %s", code, se)
		}
		waitNoProcs(t, h)
		if _, se, code := moat(t, ws, "up"); code != 0 {
			t.Fatalf("moat up: exit %d: %s\ndaemon.log:\n%s", code, se, readLog(home))
		}
		if so, se, code := moat(t, ws, "run", "--", "sh", "-c", `cat /var/tmp/keep "$HOME/keep"`); code != 0 || so != "kept\nkept\n" {
			t.Errorf("after down and up: exit %d, stdout %q, want both files kept\nstderr: %s", code, so, se)
		}
	})

	// Suspend and resume without root: a guest process's memory comes
	// back, plainly and through a standby; a plain suspend leaves nothing
	// of the user's running, a standby only its own processes.
	t.Run("suspend_and_resume", func(t *testing.T) {
		loop := `setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1`
		if _, se, code := moat(t, ws, "exec", "ws", "--", "sh", "-c", loop); code != 0 {
			t.Fatalf("starting a counter in the guest: exit %d: %s", code, se)
		}
		read := func() (n int, so, se string, code int) {
			so, se, code = moat(t, ws, "exec", "ws", "--", "cat", "/tmp/count")
			return atoi(so), so, se, code
		}
		count := func() int {
			t.Helper()
			n, so, se, code := read()
			if code != 0 || n < 0 {
				t.Fatalf("reading the guest's counter: exit %d, %q: %s\ndaemon.log:\n%s", code, so, se, readLog(home))
			}
			return n
		}
		// Far enough from 0 that a counter started again could not have
		// caught up by the read after the resume. Its file is there a
		// moment after the command that started it.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			n, so, se, code := read()
			if n >= 30 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the guest's counter did not reach 30 in 30 s: exit %d, %q: %s", code, so, se)
			}
		}
		for _, standby := range []bool{false, true} {
			before := count()
			args := []string{"suspend", "ws"}
			if standby {
				args = append(args, "--standby")
			}
			if _, se, code := moat(t, ws, args...); code != 0 {
				t.Fatalf("moat %s: exit %d: %s\ndaemon.log:\n%s", strings.Join(args, " "), code, se, readLog(home))
			}
			if !standby {
				waitNoProcs(t, h)
			} else if _, err := os.Stat(filepath.Join(state, "standby.pid")); err != nil || len(h.procs("__daemon")) == 0 {
				t.Errorf("moat suspend --standby left no standby running (%v): %v", err, h.procs(""))
			}
			want := "suspended ("
			if standby {
				want = ", standby)"
			}
			if so, _, _ := moat(t, ws, "list"); !strings.Contains(so, want) {
				t.Errorf("moat list after moat %s lacks %q:\n%s", strings.Join(args, " "), want, so)
			}
			if _, se, code := moat(t, ws, "resume", "ws"); code != 0 {
				t.Fatalf("moat resume after moat %s: exit %d: %s\ndaemon.log:\n%s", strings.Join(args, " "), code, se, readLog(home))
			}
			// The file alone would keep its last value: the counter must
			// be there and count on.
			after := count()
			for deadline := time.Now().Add(10 * time.Second); count() <= after && time.Now().Before(deadline); {
				time.Sleep(200 * time.Millisecond)
			}
			if now := count(); after < before || now <= after {
				t.Errorf("after moat %s and resume the guest's counter read %d then %d, %d before: the process did not come back\ndaemon.log:\n%s", strings.Join(args, " "), after, now, before, readLog(home))
			}
			if standby && !strings.Contains(readLog(home), "standby: go") {
				t.Errorf("the resume did not go through the standby; daemon.log:\n%s", readLog(home))
			}
		}

		// A fork and a snapshot copy the writable layer and the image,
		// which belong to the user's subordinate ids.
		before := count()
		t.Cleanup(func() { moat(t, ws, "destroy", "--yes", "ws-fork") })
		if _, se, code := moat(t, ws, "fork", "ws", "ws-fork"); code != 0 {
			t.Fatalf("moat fork ws ws-fork: exit %d: %s", code, se)
		}
		if so, se, code := moat(t, ws, "exec", "ws-fork", "--", "cat", "/tmp/count"); code != 0 || atoi(so) < before {
			t.Errorf("the fork's counter: exit %d, %q, want at least the parent's %d before the fork: %s", code, so, before, se)
		}
		atSave := count()
		if _, se, code := moat(t, ws, "snapshot", "save", "ws", "s1"); code != 0 {
			t.Fatalf("moat snapshot save ws s1: exit %d: %s", code, se)
		}
		// After the save the counter is stopped and its file says 99999:
		// a restore brings back the saved process and its file.
		// Two commands: the second's own command line names the file.
		for _, c := range []string{"pkill -f 'tmp/coun[t]'; true", "echo 99999 > /tmp/count"} {
			if _, se, code := moat(t, ws, "exec", "ws", "--", "sh", "-c", c); code != 0 {
				t.Fatalf("stopping the counter (%s): exit %d: %s", c, code, se)
			}
		}
		if _, se, code := moat(t, ws, "snapshot", "restore", "ws", "s1", "--yes"); code != 0 {
			t.Fatalf("moat snapshot restore ws s1: exit %d: %s\ndaemon.log:\n%s", code, se, readLog(home))
		}
		if c := count(); c < atSave || c >= 99999 {
			t.Errorf("after the restore of s1 the counter reads %d, %d before the save: not the saved process", c, atSave)
		}
		if _, se, code := moat(t, ws, "snapshot", "rm", "ws", "s1", "--yes"); code != 0 {
			t.Errorf("moat snapshot rm ws s1: exit %d: %s", code, se)
		}
		if ents, _ := os.ReadDir(filepath.Join(state, "snapshots")); len(ents) != 0 {
			t.Errorf("after moat snapshot rm, the snapshots dir holds %d entries", len(ents))
		}
	})

	// A killed keeper takes the gate process, the shim and runsc's
	// processes with it (parent-death signals, set again after each
	// change of ids); the next start clears runsc's stale state, which
	// belongs to a subordinate id, from inside the namespace.
	keepers := h.procs("__daemon")
	if len(keepers) != 1 {
		t.Fatalf("keeper processes of the user: %v, want one", keepers)
	}
	syscall.Kill(keepers[0].pid, syscall.SIGKILL)
	waitNoProcs(t, h)
	if so, se, code := moat(t, ws, "run", "--", "cat", "f"); code != 0 || so != "hi\n" {
		t.Fatalf("moat run after the keeper was killed: exit %d, stdout %q\nstderr: %s\ndaemon.log:\n%s", code, so, se, readLog(home))
	}

	// Destroy: the state dir holds the namespace's files (runsc's root,
	// the overlays' layers), which only a user namespace can remove; no
	// mount, namespace or process of the sandbox may outlive it. Each scan
	// must see the running sandbox first, or it could not fail.
	nsBefore := h.sandboxNamespaces()
	mountsBefore := mountsUnder(state)
	heldBefore := nsHolders(nsBefore)
	t.Logf("before destroy: %d namespaces of the sandbox held in %d places, %d mounts under its state dir", len(nsBefore), len(heldBefore), len(mountsBefore))
	if len(heldBefore) == 0 || len(mountsBefore) == 0 {
		t.Errorf("the running sandbox shows %d namespaces held in %d places and %d mounts under %s: the scans see nothing", len(nsBefore), len(heldBefore), len(mountsBefore), state)
	}
	if _, se, code := moat(t, ws, "destroy", "--yes", "ws"); code != 0 {
		t.Fatalf("moat destroy: exit %d: %s", code, se)
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state dir is still there after destroy: %v", err)
	}
	waitNoProcs(t, h)
	// As for processes, teardown may finish a moment after destroy returns.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		held := nsHolders(nsBefore)
		if len(held) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("10 s after destroy, the sandbox's namespaces are still held:\n%s", strings.Join(held, "\n"))
			break
		}
		t.Logf("after destroy, still held (waiting):\n%s", strings.Join(held, "\n"))
	}
	for _, dir := range []string{state, ws} {
		if left := mountsUnder(dir); len(left) > 0 {
			t.Errorf("after destroy, mounts at or under %s:\n%s", dir, strings.Join(left, "\n"))
		}
	}

	// An explicit disk limit needs root: refused, with what to do.
	ws2 := mkdirOwned(t, h.base, "ws2", u)
	if err := os.WriteFile(filepath.Join(ws2, "moat.toml"), []byte("[sandbox]\ndisk = \"2GiB\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { moat(t, ws2, "destroy", "--yes", "ws2") })
	_, stderr, code = moat(t, ws2, "run", "--trust-project", "--", "true")
	if code == 0 || !strings.Contains(stderr, "disk limit needs root") || !strings.Contains(stderr, `disk = "unlimited"`) {
		t.Errorf("moat run with [sandbox] disk set, rootless: exit %d, want a refusal naming the fix; stderr:\n%s", code, stderr)
	}
}

// auditWait bounds waiting for an audit record: one is written when its
// flow ends, a moment after the guest saw the refusal.
const auditWait = 3 * time.Second

// auditDenied waits for a deny record naming name in the sandbox's audit log.
func auditDenied(t *testing.T, state, name string) bool {
	t.Helper()
	for deadline := time.Now().Add(auditWait); ; {
		found := false
		err := audit.Read(filepath.Join(state, "audit", "audit.jsonl"), func(r audit.Record) bool {
			found = r.Verdict == audit.Deny && r.Name == name
			return !found
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("reading the audit log: %v", err)
		}
		if found {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// run runs moat as the user in dir, bounded in time.
func (m *moatUser) run(t *testing.T, dir string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := m.command(ctx, dir, args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("moat %v: %v", args, err)
	}
	return so.String(), se.String(), code
}

// moatBinary is MOAT_BIN, else moat built for the test, with the
// moat-sandbox beside it that it runs a sandbox's processes from; copied
// where the test user can run them.
func moatBinary(t *testing.T, base string) string {
	t.Helper()
	dst := filepath.Join(base, "moat")
	if src := os.Getenv("MOAT_BIN"); src != "" {
		if err := copyFile(src, dst, 0o755); err != nil {
			t.Fatal(err)
		}
		sb := filepath.Join(filepath.Dir(src), "moat-sandbox")
		if err := copyFile(sb, filepath.Join(base, "moat-sandbox"), 0o755); err != nil {
			t.Fatalf("MOAT_BIN's moat-sandbox (go build -o DIR/ ./cmd/... builds moat's binaries together): %v", err)
		}
		return dst
	}
	// Without cgo: the gate process's lockdown refuses a cgo binary.
	cmd := exec.Command("go", "build", "-o", base+"/", "moat.dev/moat/cmd/moat", "moat.dev/moat/cmd/moat-sandbox")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building moat and moat-sandbox (or set MOAT_BIN): %v\n%s", err, out)
	}
	return dst
}

// waitNoProcs waits until no process of the test user or its subordinate
// ids is left, for up to 10 s.
func waitNoProcs(t *testing.T, h *host) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := h.procs("")
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes of the test user left: %v", left)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// atoi is the number in s, or -1.
func atoi(s string) int {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return -1
	}
	return n
}

func readLog(home string) string {
	b, _ := os.ReadFile(filepath.Join(home, "state", "sandboxes", "ws", "daemon.log"))
	r, _ := os.ReadFile(filepath.Join(home, "state", "sandboxes", "ws", "runsc.log"))
	return string(b) + "\nrunsc.log:\n" + string(r)
}
