package e2e

// Helpers of the gate's end-to-end tests: the probe, running batches of attempts in the
// guest, reading the audit log, and the leak check.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/test/inet"
)

// ---- the probe ---------------------------------------------------------------------------

// probeBin is the probe, built once per test binary and kept in memory, so no build output
// outlives the test binary.
var probeBin struct {
	sync.Once
	b   []byte
	err error
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "/usr/local/go/bin/go"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// installProbe writes the probe into dir (the workspace, mounted at the same path in the
// guest) and returns its path.
func installProbe(t *testing.T, dir string) string {
	t.Helper()
	probeBin.Do(func() {
		tmp, err := os.MkdirTemp("", "moat-e2e-probe-")
		if err != nil {
			probeBin.err = err
			return
		}
		defer os.RemoveAll(tmp)
		out := filepath.Join(tmp, "probe")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-o", out, "./probe")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			probeBin.err = fmt.Errorf("building the probe: %v\n%s", err, b)
			return
		}
		probeBin.b, probeBin.err = os.ReadFile(out)
	})
	if probeBin.err != nil {
		t.Fatal(probeBin.err)
	}
	p := filepath.Join(dir, "probe")
	if err := os.WriteFile(p, probeBin.b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// ---- running things in the guest -----------------------------------------------------------

// script collects guest steps (curls, batches of probe operations, shell snippets) into one
// `moat run`. On a loaded host one run costs about a second, one sudo or one process start
// in the guest a few hundred milliseconds, so a subtest asks for as few as it can.
type script struct {
	g     *gateEnv
	steps []step
	out   string // where curls write what they got: in the workspace, so the test reads it
}

type step struct {
	kind     string // "curl", "probes" or "shell"
	args     []string
	bg       bool // a curl run alongside the next background curls
	calls    []call
	root     bool
	parallel bool
	shell    string
}

// call is one probe operation: the op, then its flags, then its arguments.
type call []string

func pr(args ...string) call { return call(args) }

// scriptSeq numbers scripts, so each writes its curl results to a directory of its own.
var scriptSeq atomic.Int64

func (g *gateEnv) script() *script {
	return &script{g: g, out: filepath.Join(g.dir, "out", strconv.FormatInt(scriptSeq.Add(1), 10))}
}

func (s *script) add(st step) int { s.steps = append(s.steps, st); return len(s.steps) - 1 }

// curl adds one curl; its result says status, time, headers, body and curl's exit code.
func (s *script) curl(args ...string) int { return s.add(step{kind: "curl", args: args}) }

// curlBg adds a curl that runs at the same time as the background curls next to it: for
// attempts that do not depend on each other.
func (s *script) curlBg(args ...string) int { return s.add(step{kind: "curl", args: args, bg: true}) }

// probes adds probe operations run one after another in one probe process.
func (s *script) probes(calls ...call) int { return s.add(step{kind: "probes", calls: calls}) }

// parallel adds probe operations run at the same time: for attempts that each wait out a drop.
func (s *script) parallel(calls ...call) int {
	return s.add(step{kind: "probes", calls: calls, parallel: true})
}

// rootProbes adds probe operations run one after another as root in the guest.
func (s *script) rootProbes(calls ...call) int {
	return s.add(step{kind: "probes", calls: calls, root: true})
}

// shell adds a shell snippet whose output is returned as text.
func (s *script) shell(cmd string) int { return s.add(step{kind: "shell", shell: cmd}) }

const (
	stepMark = "=moat-e2e-step="
)

func (s *script) text() string {
	var sb strings.Builder
	// Curls write their results to files in the workspace, which the test reads on the
	// host: printing them from the guest would cost a process each.
	file := func(i int) string { return filepath.Join(s.out, fmt.Sprintf("curl-%d", i)) }
	printCurl := func(i int) { fmt.Fprintf(&sb, "echo %s%d\n", stepMark, i) }
	fmt.Fprintf(&sb, "mkdir -p %s\n", shQuote(s.out))
	var pending []int
	flush := func() {
		if len(pending) == 0 {
			return
		}
		sb.WriteString("wait")
		for _, i := range pending {
			fmt.Fprintf(&sb, " $P%d", i)
		}
		sb.WriteString("\n")
		for _, i := range pending {
			printCurl(i)
		}
		pending = nil
	}
	for i, st := range s.steps {
		if st.kind == "curl" {
			full := append([]string{"curl", "-sS", "--max-time", curlMaxTimeS, "-D", file(i) + ".h", "-o", file(i) + ".b", "-w", "%{http_code} %{time_total}"}, st.args...)
			cmd := fmt.Sprintf("%[2]s >%[1]s.w 2>%[1]s.e; echo $? >%[1]s.rc", file(i), shQuote(full...))
			if st.bg {
				fmt.Fprintf(&sb, "( %s ) & P%d=$!\n", cmd, i)
				pending = append(pending, i)
				continue
			}
			flush()
			sb.WriteString(cmd + "\n")
			printCurl(i)
			continue
		}
		flush()
		fmt.Fprintf(&sb, "echo %s%d\n", stepMark, i)
		switch st.kind {
		case "probes":
			sb.WriteString("printf '%s\\n'")
			for j, c := range st.calls {
				argv := append([]string{c[0], "-tag", strconv.Itoa(j)}, c[1:]...)
				b, _ := json.Marshal(argv)
				sb.WriteString(" " + shQuote(string(b)))
			}
			sb.WriteString(" | ")
			if st.root {
				sb.WriteString("sudo -n ")
			}
			sb.WriteString(shQuote(s.g.probe, "batch"))
			if st.parallel {
				sb.WriteString(" -parallel")
			}
			sb.WriteString("\n")
		case "shell":
			sb.WriteString("( " + st.shell + "\n) 2>&1\n")
		}
	}
	flush()
	fmt.Fprintf(&sb, "echo %send\ntrue\n", stepMark)
	return sb.String()
}

// scriptOut is what a script's steps printed, step by step.
type scriptOut struct {
	s     *script
	parts []string
}

// run runs the script in the sandbox; the script itself always exits 0 (attempts that fail
// are results, not errors).
func (s *script) run(t *testing.T) *scriptOut {
	t.Helper()
	out := s.g.sh(t, s.text())
	o := &scriptOut{s: s, parts: make([]string, len(s.steps))}
	cur := -1
	var sb strings.Builder
	flush := func() {
		if cur >= 0 && cur < len(o.parts) {
			o.parts[cur] = sb.String()
		}
		sb.Reset()
	}
	ended := false
	for _, l := range strings.SplitAfter(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSuffix(l, "\n"), stepMark); ok {
			flush()
			if rest == "end" {
				ended = true
				break
			}
			cur, _ = strconv.Atoi(rest)
			continue
		}
		sb.WriteString(l)
	}
	if !ended {
		t.Fatalf("the guest script ended early; output:\n%s", gateTail(out, 40))
	}
	return o
}

// sh runs a shell script in the sandbox and returns its stdout; the script must exit 0.
func (g *gateEnv) sh(t *testing.T, script string) string {
	t.Helper()
	start := time.Now()
	r := moat(t, g.dir, g.env, "run", "--", "sh", "-c", script)
	took := time.Since(start)
	t.Logf("guest session took %v", took.Round(time.Millisecond))
	if took > guestRunBound {
		t.Errorf("one guest run took %v (bound %v): something waited on a timeout instead of being refused", took.Round(time.Millisecond), guestRunBound)
	}
	if r.code != 0 {
		t.Fatalf("guest script failed: exit %d\nscript: %s\nstdout: %s\nstderr: %s\n%s", r.code, gateClip(script, 2000), gateTail(r.stdout, 40), r.stderr, g.daemonLog())
	}
	return r.stdout
}

func (o *scriptOut) text(i int) string { return o.parts[i] }

// curl returns the result of step i, a curl.
func (o *scriptOut) curl(t *testing.T, i int) curlResult {
	t.Helper()
	read := func(ext string) string {
		b, _ := os.ReadFile(filepath.Join(o.s.out, fmt.Sprintf("curl-%d.%s", i, ext)))
		return string(b)
	}
	c := curlResult{args: o.s.steps[i].args, headers: read("h"), body: read("b"), stderr: read("e")}
	f := strings.Fields(read("w"))
	rc, err := strconv.Atoi(strings.TrimSpace(read("rc")))
	if len(f) != 2 || err != nil {
		t.Fatalf("curl %q left no result (write-out %q, exit %q, stderr %q)", c.args, read("w"), read("rc"), c.stderr)
	}
	c.status, c.exit = f[0], rc
	c.secs, _ = strconv.ParseFloat(f[1], 64)
	t.Logf("guest: %v", c)
	return c
}

// probes returns the results of step i, a batch of probe operations, in the order asked.
func (o *scriptOut) probes(t *testing.T, i int) []probeResult {
	t.Helper()
	calls := o.s.steps[i].calls
	res := make([]probeResult, len(calls))
	seen := make([]bool, len(calls))
	for _, l := range strings.Split(o.parts[i], "\n") {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var r probeResult
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("probe printed %q: %v", l, err)
		}
		j, err := strconv.Atoi(r.Tag)
		if err != nil || j < 0 || j >= len(calls) {
			t.Fatalf("probe line with an unknown tag: %q", l)
		}
		res[j], seen[j] = r, true
	}
	for j, ok := range seen {
		if !ok {
			t.Fatalf("probe %q printed nothing; step output:\n%s", calls[j], o.parts[i])
		}
		t.Logf("guest: probe %s: %v", strings.Join(calls[j], " "), res[j])
	}
	return res
}

// curls runs one curl per argument list, all at once, in one guest session.
func (g *gateEnv) curls(t *testing.T, argss ...[]string) []curlResult {
	t.Helper()
	s := g.script()
	for _, a := range argss {
		s.curlBg(a...)
	}
	o := s.run(t)
	res := make([]curlResult, len(argss))
	for i := range argss {
		res[i] = o.curl(t, i)
	}
	return res
}

// probes runs probe operations one after another in one guest session.
func (g *gateEnv) probes(t *testing.T, calls ...call) []probeResult {
	t.Helper()
	s := g.script()
	s.probes(calls...)
	return s.run(t).probes(t, 0)
}

// probeResult is one line of the probe's output.
type probeResult struct {
	Op   string  `json:"op"`
	Tag  string  `json:"tag"`
	OK   bool    `json:"ok"`
	Err  string  `json:"err"`
	MS   float64 `json:"ms"`
	Data string  `json:"data"`
}

func (p probeResult) String() string {
	s := fmt.Sprintf("ok=%v %.0fms", p.OK, p.MS)
	if p.Err != "" {
		s += " err=" + p.Err
	}
	if p.Data != "" {
		s += fmt.Sprintf(" data=%q", gateClip(p.Data, 160))
	}
	return s
}

func (p probeResult) took() time.Duration { return time.Duration(p.MS * float64(time.Millisecond)) }

func shQuote(args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// curlResult is what one curl in the guest got.
type curlResult struct {
	args    []string
	exit    int
	status  string // HTTP status code, "000" when there was no response
	secs    float64
	headers string
	body    string
	stderr  string
}

func (c curlResult) String() string {
	return fmt.Sprintf("curl %s: exit %d, status %s, %.3fs, body %q, stderr %q", strings.Join(c.args, " "), c.exit, c.status, c.secs, gateClip(c.body, 160), strings.TrimSpace(c.stderr))
}

func (c curlResult) took() time.Duration { return time.Duration(c.secs * float64(time.Second)) }

// ---- the audit log -------------------------------------------------------------------------

// auditRec is one line of audit.jsonl (schema 1).
type auditRec struct {
	Schema     int       `json:"schema"`
	Time       time.Time `json:"time"`
	Sandbox    string    `json:"sandbox"`
	Proto      string    `json:"proto"`
	Dst        string    `json:"dst"`
	Name       string    `json:"name"`
	NameFrom   string    `json:"name_from"`
	Verdict    string    `json:"verdict"`
	Rule       string    `json:"rule"`
	Layer      string    `json:"layer"`
	Reason     string    `json:"reason"`
	Upstream   string    `json:"upstream"`
	BytesUp    int64     `json:"bytes_up"`
	BytesDown  int64     `json:"bytes_down"`
	DurationMS int64     `json:"duration_ms"`
}

func (r auditRec) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// audit reads the sandbox's audit log, both series as moat network audit does, but for the
// start records of carried connections: each connection's end record says all they do, and
// its bytes.
func (g *gateEnv) audit(t *testing.T) []auditRec {
	t.Helper()
	return readAuditDir(t, g.state)
}

// readAuditDir is gateEnv.audit for the sandbox whose state directory is stateDir.
func readAuditDir(t *testing.T, stateDir string) []auditRec {
	t.Helper()
	var out []auditRec
	err := audit.Read(filepath.Join(stateDir, "audit", "audit.jsonl"), func(r audit.Record) bool {
		if r.Phase != audit.PhaseStart {
			out = append(out, auditRec{Schema: r.Schema, Time: r.Time, Sandbox: r.Sandbox, Proto: r.Proto, Dst: r.Dst,
				Name: r.Name, NameFrom: string(r.NameFrom), Verdict: string(r.Verdict), Rule: r.Rule, Layer: r.Layer, Reason: string(r.Reason),
				Upstream: r.Upstream, BytesUp: r.BytesUp, BytesDown: r.BytesDown, DurationMS: r.DurationMS})
		}
		return true
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("reading the audit log: %v", err)
	}
	return out
}

// mark is where the audit log ends now; expect looks only after it.
func (g *gateEnv) mark(t *testing.T) int { t.Helper(); return len(g.audit(t)) }

// match selects audit records: empty fields match anything; Dst may end in "*" for a prefix
// and start with "*" for a suffix (":8080" of a pool address).
type match struct {
	Proto, Dst, Name, NameFrom, Verdict string
	Reason                              string // substring
}

func (m match) String() string {
	b, _ := json.Marshal(m)
	return string(b)
}

func (m match) ok(r auditRec) bool {
	eq := func(want, got string) bool { return want == "" || strings.EqualFold(want, got) }
	dst := m.Dst == "" || r.Dst == m.Dst ||
		strings.HasSuffix(m.Dst, "*") && strings.HasPrefix(r.Dst, strings.TrimSuffix(m.Dst, "*")) ||
		strings.HasPrefix(m.Dst, "*") && strings.HasSuffix(r.Dst, strings.TrimPrefix(m.Dst, "*"))
	return eq(m.Proto, r.Proto) && dst && eq(m.Name, r.Name) && eq(m.NameFrom, r.NameFrom) &&
		eq(m.Verdict, r.Verdict) && (m.Reason == "" || strings.Contains(strings.ToLower(r.Reason), strings.ToLower(m.Reason)))
}

// expect waits for an audit record after since that matches m, and returns it.
func (g *gateEnv) expect(t *testing.T, since int, m match) (auditRec, bool) {
	t.Helper()
	deadline := time.Now().Add(auditWait)
	for {
		all := g.audit(t)
		if since > len(all) {
			since = 0 // rotated
		}
		for _, r := range all[since:] {
			if m.ok(r) {
				return r, true
			}
		}
		if time.Now().After(deadline) {
			var recent []string
			for _, r := range all[since:] {
				recent = append(recent, r.String())
			}
			t.Errorf("no audit record %v; records since the attempt:\n%s", m, gateTail(strings.Join(recent, "\n"), 40))
			return auditRec{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// denied expects a deny record.
func (g *gateEnv) denied(t *testing.T, since int, m match) auditRec {
	t.Helper()
	m.Verdict = "deny"
	r, _ := g.expect(t, since, m)
	return r
}

// noAllow fails if any record after since allows something m matches (m.Verdict is set).
func (g *gateEnv) noAllow(t *testing.T, since int, m match) {
	t.Helper()
	m.Verdict = "allow"
	all := g.audit(t)
	if since > len(all) {
		since = 0
	}
	for _, r := range all[since:] {
		if m.ok(r) {
			t.Errorf("the gate allowed what it must deny: %v", r)
		}
	}
}

// ---- leaks ---------------------------------------------------------------------------------

type counts struct {
	conns, hits int
	bytes       int64
}

func countsOf(s *inet.Server) counts { return counts{s.Conns(), s.Hits(), s.BytesIn()} }

// noLeaks snapshots every watched server, the host listener and the DNS query log, and checks
// at the end of t that none of them heard anything from the guest.
func (g *gateEnv) noLeaks(t *testing.T) {
	t.Helper()
	before := map[string]counts{}
	for _, role := range g.watched {
		before[role] = countsOf(g.srv[role])
	}
	hostBefore := g.host.accepts.Load()
	qBefore := len(g.net.Queries())
	pid := g.daemonPID(t)
	t.Cleanup(func() {
		// `moat run` starts a sandbox that is not running, so a daemon the guest crashed
		// would be replaced silently by the next subtest: the pid tells.
		alive := func() bool { return syscall.Kill(pid, 0) == nil }
		if t.Failed() {
			// A guest session that lost its sandbox may have raced the daemon's exit: give a
			// panicking daemon the time to die, so the crash is blamed here.
			for end := time.Now().Add(2 * time.Second); alive() && time.Now().Before(end); {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if now := g.daemonPID(t); now != pid || !alive() {
			t.Errorf("CRASH: the sandbox's daemon (pid %d) died during this subtest: the guest took its gate down\n%s", pid, g.crashLog(pid))
			if now == pid {
				// Start it again so that the next subtest runs against a live gate and is not
				// blamed for this crash.
				g.up(t)
			}
		}
		for _, role := range g.watched {
			if now := countsOf(g.srv[role]); now != before[role] {
				s := g.srv[role]
				t.Errorf("LEAK: %s (%s) was contacted: connections %d→%d, requests/datagrams %d→%d, bytes %d→%d; payloads: %q",
					role, s.Addr, before[role].conns, now.conns, before[role].hits, now.hits, before[role].bytes, now.bytes, lastPayloads(s))
			}
		}
		if a := g.host.accepts.Load(); a != hostBefore {
			t.Errorf("LEAK: the host's own listener (port %d on every host address) accepted %d connections from the sandbox", g.host.port, a-hostBefore)
		}
		qs := g.net.Queries()
		if len(qs) >= qBefore {
			for i, q := range qs[qBefore:] {
				if i+qBefore >= g.liveWindow[0] && i+qBefore < g.liveWindow[1] && strings.EqualFold(q, "live.test A") {
					continue
				}
				if !queryAllowed(q) {
					t.Errorf("LEAK: the upstream DNS server was asked %q: only A questions for names the policy allows may leave the gate", q)
				}
			}
		}
	})
}

// crashLog is the part of the daemon log about the daemon with pid: its panic, if any.
func (g *gateEnv) crashLog(pid int) string {
	b, _ := os.ReadFile(filepath.Join(g.state, "daemon.log"))
	s := string(b)
	if i := strings.LastIndex(s, "panic:"); i >= 0 {
		return "daemon.log:\n" + gateClip(s[i:], 3000)
	}
	return g.daemonLog()
}

func lastPayloads(s *inet.Server) []string {
	var out []string
	for _, p := range s.Payloads() {
		out = append(out, gateClip(string(p), 80))
	}
	for _, r := range s.Requests() {
		out = append(out, r.Method+" "+r.Host+r.Path)
	}
	if len(out) > 5 {
		out = out[len(out)-5:]
	}
	return out
}

func queryAllowed(q string) bool {
	i := strings.LastIndexByte(q, ' ')
	if i < 0 {
		return false
	}
	name, typ := strings.ToLower(strings.TrimSuffix(q[:i], ".")), q[i+1:]
	if typ != "A" {
		return false
	}
	if slices.Contains(allowedQueries, name) {
		return true
	}
	return strings.HasSuffix(name, ".wild.test") && name != "blocked.wild.test"
}

// ---- small checks ---------------------------------------------------------------------------

// refusedPromptly checks a probe that must have failed, and quickly. A TLS probe whose
// answer is the gate's own 403 page (X-Moat-Denied, over TLS from the sandbox CA) was refused
// too: that is how the gate refuses a name it can terminate TLS for.
func refusedPromptly(t *testing.T, what string, r probeResult) {
	t.Helper()
	if r.OK && !gatePage(r.Data) {
		t.Errorf("%s: succeeded, want it refused: %v", what, r)
		return
	}
	if r.took() > promptly {
		t.Errorf("%s: refused only after %v (want < %v): %v", what, r.took().Round(time.Millisecond), promptly, r)
	}
}

// gatePage reports whether a probe's data is the gate's refusal page.
func gatePage(data string) bool {
	return strings.HasPrefix(data, "HTTP/1.1 403 ") && strings.Contains(data, "X-Moat-Denied:")
}

// droppedWithin checks a probe whose traffic the gate drops silently: it must fail, and by
// the probe's own short deadline, not later.
func droppedWithin(t *testing.T, what string, r probeResult, bound time.Duration) {
	t.Helper()
	if r.OK {
		t.Errorf("%s: got an answer, want none: %v", what, r)
		return
	}
	if r.took() > bound {
		t.Errorf("%s: failed only after %v (bound %v): %v", what, r.took().Round(time.Millisecond), bound, r)
	}
}

// curlDenied checks a curl that must have been refused by the gate: a connection refused or
// closed, or the gate's 403, promptly.
func curlDenied(t *testing.T, c curlResult) {
	t.Helper()
	if c.exit == 0 && c.status != "403" {
		t.Errorf("not denied: %v", c)
		return
	}
	if c.took() > promptly {
		t.Errorf("denied only after %v (want < %v): %v", c.took().Round(time.Millisecond), promptly, c)
	}
	if c.status == "403" && !strings.Contains(strings.ToLower(c.headers), "x-moat-denied") {
		t.Errorf("a 403 without X-Moat-Denied is not the gate's: %v\nheaders: %s", c, c.headers)
	}
}

// curlReached checks a curl that must have got through to the server at want (the inet
// servers name themselves and the Host in their body).
func curlReached(t *testing.T, c curlResult, want string) {
	t.Helper()
	if c.exit != 0 || c.status != "200" || !strings.Contains(c.body, want) {
		t.Errorf("want a 200 from %q: %v", want, c)
	}
}

func gateClip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func gateTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// inPool reports whether s is an address from the gate's private pool.
func inPool(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && netip.MustParsePrefix("198.18.0.0/15").Contains(a)
}

// answerA returns the first A address in a dns probe's data ("NOERROR n=1 A 1.2.3.4").
func answerA(data string) string {
	f := strings.Fields(strings.ReplaceAll(data, ";", " "))
	for i, w := range f {
		if w == "A" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

// snmpCounter reads one counter of /proc/net/snmp inside the test internet's namespace
// ("Icmp", "InMsgs"): traffic that reached the namespace at all, whatever port or server.
func (g *gateEnv) snmpCounter(t *testing.T, group, field string) int64 {
	t.Helper()
	out, err := g.net.Exec(t, "cat", "/proc/net/snmp")
	if err != nil {
		t.Fatalf("reading the namespace's snmp counters: %v\n%s", err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	var names []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != group+":" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, n := range names {
			if n == field && i+1 < len(f) {
				v, _ := strconv.ParseInt(f[i+1], 10, 64)
				return v
			}
		}
	}
	t.Fatalf("no %s %s in the namespace's /proc/net/snmp", group, field)
	return 0
}

// gateProcess is the gate process of the daemon whose keeper is keeper:
// the process that reads the guest's bytes, where the gate's memory and
// descriptors are. A daemon of one process (a moat from before the split,
// as the benchmarks' baseline runs it) is its own gate process;
// TestPrivilegeSeparation fails if the binary under test has none.
func gateProcess(t *testing.T, keeper int) int {
	t.Helper()
	for _, p := range processTree(keeper) {
		if a := cmdline(p); len(a) > 1 && a[1] == "__gate" {
			return p
		}
	}
	return keeper
}

func (g *gateEnv) daemonPID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.state, "daemon.pid"))
	if err != nil {
		t.Fatalf("reading daemon.pid: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// mustMoatEnv is mustMoat with the sandbox's environment.
func mustMoatEnv(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	r := moat(t, dir, env, args...)
	if r.code != 0 {
		t.Fatalf("moat %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}
