package e2e

// Threat model 37: the audit keeps what matters through a flood of refusals, and a
// connection that ends while the disk is full keeps its decision on record, with no torn line.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/testfs"
	"moat.dev/moat/test/inet"
)

const (
	// floodFor is how long the guest floods. The attack this answers flooded for a minute
	// against the old default of 64 MiB, which rotated every earlier record away. Here the audit's bound is
	// 1 MiB, 64 times smaller, so 20 s of the same flood is far more of it than the attack's
	// minute was of 64 MiB: the same pressure, and CI stays quick.
	floodFor = 20 * time.Second
	// auditMaxBytes is the sandbox's [audit] max_size.
	auditMaxBytes = 1 << 20
	floodIP       = "203.0.113.5" // refused: no rule allows it
)

const floodToml = `[network]
use = ["none"]
allow = ["allowed.test", "up.test"]
trust = [%q]

[secrets.MOAT_FLOODKEY]
from = "env:MOAT_TEST_FLOODKEY"
hosts = ["up.test"]

[audit]
max_size = "1MiB"
`

// floodPy floods refusals from the guest for argv[1] seconds: UDP to one address and port,
// UDP to random ports (many destinations), TCP connections to one port, and DNS lookups of a
// denied name. It prints how many of each it sent.
const floodPy = `import json, random, socket, struct, sys, time
dur, ip, gw = float(sys.argv[1]), sys.argv[2], sys.argv[3]
q = struct.pack(">HHHHHH", 7, 0x100, 1, 0, 0, 0)
for label in b"flood.evil.test".split(b"."):
    q += bytes([len(label)]) + label
q += b"\x00" + struct.pack(">HH", 1, 1)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dns.setblocking(False)
n = {"udp": 0, "udp_random": 0, "tcp": 0, "dns": 0}
end = time.time() + dur
while time.time() < end:
    for _ in range(20):
        udp.sendto(b"x", (ip, 9999))
        n["udp"] += 1
    udp.sendto(b"x", (ip, random.randint(1024, 65535)))
    n["udp_random"] += 1
    dns.sendto(q, (gw, 53))
    n["dns"] += 1
    try:
        while True:
            dns.recv(512)
    except BlockingIOError:
        pass
    s = socket.socket()
    s.settimeout(0.5)
    try:
        s.connect((ip, 9998))
    except OSError:
        pass
    s.close()
    n["tcp"] += 1
print(json.dumps(n))
`

// auditLine is a record as moat network audit --json prints it.
type auditLine = audit.Record

func auditLines(t *testing.T, g *gateEnv) []auditLine {
	t.Helper()
	out := mustMoatEnv(t, g.dir, g.env, "network", "audit", g.name, "--json")
	var recs []auditLine
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		var r auditLine
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("moat network audit --json printed a line that is not a record: %q", l)
		}
		recs = append(recs, r)
	}
	return recs
}

// kept is the identity of a record that must survive the flood.
func keptKey(r auditLine) string {
	return fmt.Sprintf("%s %s %s %s %s %s", r.Time.Format(time.RFC3339Nano), r.Proto, r.Phase, r.Flow, r.Path, strings.Join(r.Transforms, ","))
}

// TestAuditFlood: allowed and secret-use traffic, then a flood of refused UDP, TCP and DNS.
// Every allow and secret-use record is still there (through moat network audit), the flood
// shows as aggregates whose counts add up to what the ledger counted one by one, the audit
// files stay under their bound, and the gate still lets allowed traffic through.
func TestAuditFlood(t *testing.T) {
	n := inet.Start(t)
	n.SetA("allowed.test", allowedIP)
	n.SetA("up.test", upIP)
	n.HTTP(t, allowedIP, 80, nil)
	n.HTTPS(t, upIP, 443, []string{"up.test"}, inet.Site(""))
	g := newGateEnv(t, n, "audit-flood", "")
	if err := os.WriteFile(filepath.Join(g.dir, "moat.toml"), []byte(fmt.Sprintf(floodToml, g.ca)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.dir, "flood.py"), []byte(floodPy), 0o644); err != nil {
		t.Fatal(err)
	}
	g.env = append(g.env, "MOAT_TEST_FLOODKEY=mf"+randHex(t, 20))
	t.Cleanup(func() { moat(t, g.dir, g.env, "destroy", "--yes", g.name) })
	g.up(t)

	const fetches = 3
	before := g.sh(t, fmt.Sprintf(`for i in $(seq %d); do
  curl -sS -o /dev/null -w '%%{http_code} ' http://allowed.test/
  curl -sS -o /dev/null -w '%%{http_code} ' --cacert %s -H "Authorization: Bearer $MOAT_FLOODKEY" https://up.test/echo
done`, fetches, g.ca))
	if want := strings.Repeat("200 ", 2*fetches); before != want {
		t.Fatalf("before the flood: %q, want %q", before, want)
	}
	must := map[string]auditLine{}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		clear(must)
		allows, secrets := 0, 0
		for _, r := range auditLines(t, g) {
			switch {
			case len(r.Transforms) > 0:
				secrets++
			case r.Verdict == audit.Allow && r.Proto == "tcp":
				allows++
			default:
				continue
			}
			must[keptKey(r)] = r
		}
		// Each allowed connection has a start and an end; each secret use an http record.
		if allows >= 2*2*fetches && secrets >= fetches {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("before the flood: %d allow records of tcp and %d with transforms, want %d and %d", allows, secrets, 4*fetches, fetches)
		}
	}

	start := time.Now()
	// Not g.sh: the flood takes longer than one ordinary guest session may.
	fr := moat(t, g.dir, g.env, "run", "--", "python3", g.dir+"/flood.py", strconv.Itoa(int(floodFor/time.Second)), floodIP, gatewayIP)
	var sent map[string]int64
	if err := json.Unmarshal([]byte(strings.TrimSpace(fr.stdout)), &sent); fr.code != 0 || err != nil {
		t.Fatalf("the flood: exit %d, output %q (%v), stderr %q", fr.code, fr.stdout, err, fr.stderr)
	}
	t.Logf("flood of %v sent %v", time.Since(start).Round(time.Second), sent)

	// The aggregates of the last interval come at its end: it began before the flood ended,
	// and the log's writer ends an interval within a second of its 10 s.
	time.Sleep(audit.DefaultInterval + 2*time.Second)
	type dest struct{ proto, dst, name string }
	floods := []dest{{"udp", floodIP + ":9999", ""}, {"tcp", floodIP + ":9998", ""}, {"dns", "gateway:53", "flood.evil.test"}}
	var recs []auditLine
	total := map[dest]int64{}
	aggregates := map[dest]int{}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		recs = auditLines(t, g)
		clear(total)
		clear(aggregates)
		for _, r := range recs {
			for _, d := range floods {
				if r.Proto == d.proto && r.Dst == d.dst && (d.name == "" || r.Name == d.name) && r.Verdict == audit.Deny {
					total[d] += max(r.Count, 1)
					if r.Count > 0 {
						aggregates[d]++
					}
				}
			}
		}
		if len(aggregates) == len(floods) || time.Now().After(deadline) {
			break
		}
	}
	for _, d := range floods {
		if aggregates[d] == 0 {
			t.Errorf("%s %s %s: no aggregate with a count among %d records for it", d.proto, d.dst, d.name, total[d])
		}
	}
	// Nothing lost silently: every record the gate could not write is counted, in the log
	// and in moat status.
	// rotated: the refusals the noise series rotated away (the random ports fill it), one by
	// one or counted in aggregates; the drop notices say how many records of each kind.
	var dropped, rotated, rotatedAggs int64
	for _, r := range recs {
		if r.Verdict == audit.Dropped && r.DroppedKinds == nil {
			dropped += r.Dropped
		}
		if r.Verdict == audit.Dropped && r.DroppedKinds != nil {
			rotated += r.DroppedKinds["deny"]
			rotatedAggs += r.DroppedKinds["aggregate"]
		}
	}
	var st struct {
		Gate struct {
			AuditLost    int64  `json:"audit_lost"`
			AuditFailing string `json:"audit_failing"`
		} `json:"gate"`
	}
	if err := json.Unmarshal([]byte(mustMoatEnv(t, g.dir, g.env, "status", g.name, "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Gate.AuditLost != dropped {
		t.Errorf("moat status says %d audit records lost; the log's dropped records say %d", st.Gate.AuditLost, dropped)
	}
	// The ledger counts every denial; the audit's records and counts add up to the same, less
	// what was lost or rotated away (the ledger is in memory, the audit on disk). An aggregate
	// rotated away stands for an unknown number of them: then only the upper bound holds.
	var den struct {
		Sandboxes []struct {
			Entries []audit.Entry `json:"entries"`
		} `json:"sandboxes"`
	}
	if err := json.Unmarshal([]byte(mustMoatEnv(t, g.dir, g.env, "network", "denials", g.name, "--json")), &den); err != nil || len(den.Sandboxes) != 1 {
		t.Fatalf("moat network denials --json: %v", err)
	}
	for _, d := range floods[:2] {
		var ledger int64
		for _, e := range den.Sandboxes[0].Entries {
			if e.Proto == d.proto && e.Dest == d.dst {
				ledger = e.Count
			}
		}
		if missing := ledger - total[d]; ledger == 0 || missing < 0 || missing > dropped+rotated && rotatedAggs == 0 {
			t.Errorf("%s %s: the ledger counted %d denials, the audit %d (%d records lost, %d refusals rotated away in all)",
				d.proto, d.dst, ledger, total[d], dropped, rotated)
		}
		t.Logf("%s %s: %d sent, %d denied, %d audited, %d of them in aggregates", d.proto, d.dst, sent[d.proto], ledger, total[d], aggregates[d])
	}

	// Every allow and secret-use record from before the flood is still there.
	have := map[string]bool{}
	for _, r := range recs {
		have[keptKey(r)] = true
	}
	for k, r := range must {
		if !have[k] {
			t.Errorf("lost in the flood: %+v", r)
		}
	}
	var notices []string
	for _, r := range recs {
		if r.Verdict == audit.Dropped {
			notices = append(notices, string(r.Reason))
		}
	}
	t.Logf("%d records after the flood; dropped notices: %q", len(recs), notices)

	// Under the bound, every file of both series.
	names, err := filepath.Glob(filepath.Join(g.state, "audit", "audit*.jsonl*"))
	if err != nil {
		t.Fatal(err)
	}
	var size int64
	for _, name := range names {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		size += fi.Size()
	}
	if size > auditMaxBytes {
		t.Errorf("the audit files hold %d bytes, over their bound of %d: %v", size, auditMaxBytes, names)
	}
	t.Logf("audit files: %d bytes in %d files", size, len(names))

	// The gate still decides as before: the flood did not fill what it must keep.
	if st.Gate.AuditFailing != "" {
		t.Errorf("the audit log fails after the flood: %s", st.Gate.AuditFailing)
	}
	if got := g.sh(t, "curl -sS -o /dev/null -w '%{http_code}' http://allowed.test/"); got != "200" {
		t.Errorf("after the flood, an allowed fetch got %q", got)
	}
}

// TestAuditFullDiskDownload: a long allowed download while the host fills the disk under the
// sandbox's state. Its decision is on record before the disk fills; its end is either a whole
// record or counted as lost (moat status), and no line of the audit is torn.
func TestAuditFullDiskDownload(t *testing.T) {
	home := testfs.Small(t, "64m")
	n := inet.Start(t)
	n.SetA("allowed.test", allowedIP)
	n.HTTP(t, allowedIP, 80, inet.Site(""))
	// disk = "unlimited": the writable layer in the state directory, not an image the small
	// filesystem has no room for.
	g := newGateEnv(t, n, "audit-fulldisk", "[sandbox]\ndisk = \"unlimited\"\n[network]\nuse = [\"none\"]\nallow = [\"allowed.test\"]\n")
	g.env = append(g.env, "MOAT_HOME="+home)
	g.state = filepath.Join(home, "state", "sandboxes", g.name)
	var filler string
	t.Cleanup(func() {
		if filler != "" {
			os.Remove(filler)
		}
		c := exec.Command(moatBin, "destroy", "--yes", g.name)
		c.Env = moatEnv(g.env)
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("destroy: %v\n%s", err, out)
			if b, err := os.ReadFile(filepath.Join(g.state, "daemon.pid")); err == nil {
				if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	g.up(t)

	// 60 events 100 ms apart: a download of 6 s, through the gate as one connection.
	type done struct {
		out []byte
		err error
	}
	dl := make(chan done, 1)
	go func() {
		c := exec.Command(moatBin, "run", "--", "sh", "-c",
			"curl -sS -o /dev/null -w '%{http_code} %{size_download}' --max-time 30 'http://allowed.test/sse?n=60&gap_ms=100'")
		c.Dir, c.Env = g.dir, moatEnv(g.env)
		out, err := c.Output()
		dl <- done{out, err}
	}()
	path := filepath.Join(g.state, "audit", "audit.jsonl")
	var start audit.Record
	for deadline := time.Now().Add(20 * time.Second); start.Flow == ""; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no start record for the download within 20 s")
		}
		audit.Read(path, func(r audit.Record) bool {
			if r.Phase == audit.PhaseStart && r.Name == "allowed.test" && strings.HasSuffix(r.Dst, ":80") {
				start = r
			}
			return true
		})
	}
	filler = testfs.Fill(t, home)
	var res done
	select {
	case res = <-dl:
	case <-time.After(60 * time.Second):
		t.Fatal("the download did not end within 60 s")
	}
	t.Logf("download with the disk full: %q, %v", res.out, res.err)

	// The decision, whole; the end, whole or counted as lost.
	var gotStart bool
	var end audit.Record
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		gotStart = false
		audit.Read(path, func(r audit.Record) bool {
			switch {
			case r.Flow != start.Flow:
			case r.Phase == audit.PhaseStart:
				gotStart = r.Verdict == audit.Allow && r.Rule == "allowed.test" && r.Upstream == allowedIP+":80"
			case r.Phase == audit.PhaseEnd:
				end = r
			}
			return true
		})
		if end.Flow != "" || time.Now().After(deadline) {
			break
		}
	}
	if !gotStart {
		t.Errorf("the start record of flow %s is not whole: %+v", start.Flow, start)
	}
	var st struct {
		Gate struct {
			AuditLost int64 `json:"audit_lost"`
		} `json:"gate"`
	}
	if r := moat(t, g.dir, g.env, "status", g.name, "--json"); json.Unmarshal([]byte(r.stdout), &st) != nil {
		t.Errorf("moat status --json with the disk full: exit %d, %q", r.code, r.stderr)
	}
	switch {
	case end.Flow != "":
		if end.BytesDown == 0 || end.Verdict != audit.Allow || end.DurationMS == 0 {
			t.Errorf("the end record: %+v; want the bytes and the duration", end)
		}
		t.Logf("end record whole: %d bytes down in %d ms", end.BytesDown, end.DurationMS)
	case st.Gate.AuditLost > 0:
		t.Logf("the end record was lost, and moat status says so: %d lost", st.Gate.AuditLost)
	default:
		t.Errorf("no end record for flow %s, and moat status reports none lost", start.Flow)
	}
	names, _ := filepath.Glob(filepath.Join(g.state, "audit", "audit*.jsonl*"))
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 0 && b[len(b)-1] != '\n' {
			t.Errorf("%s ends in part of a line: %.80q", name, b[max(0, len(b)-80):])
		}
		for i, l := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
			if len(l) > 0 && !json.Valid(l) {
				t.Errorf("%s line %d is torn: %.80q", name, i+1, l)
			}
		}
	}
}
