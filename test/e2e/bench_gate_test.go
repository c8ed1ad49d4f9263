package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/test/inet"
)

// TestBenchGate is the gate's benchmark (bench/gate.sh), not a test: it
// runs only with MOAT_BENCH_GATE=1 and prints figures, each next to its
// direct baseline measured in the same run by the same probe program.
//
// Two more columns say where the time goes. "guest lo" is the same
// operation kept inside the guest (the probe talks to a server of its own on
// 127.0.0.1): what the guest's kernel, gVisor's Sentry, costs without the
// gate. "tap0" is measured by a packet socket on the sandbox's tap0: from
// the guest's frame leaving for the gate to the gate's answer coming back
// (SYN to SYN-ACK or RST, DNS query to answer), which is the gate's whole
// share, TAP hops and upstream dials included, and none of the guest's.
func TestBenchGate(t *testing.T) {
	if os.Getenv("MOAT_BENCH_GATE") == "" {
		t.Skip("a benchmark, not a test: run bench/gate.sh")
	}
	rounds := envInt("R", 3)
	sizeMiB := envInt("SIZE_MIB", 1024)
	readKiB := envInt("READ_KIB", 1024)
	connects := envInt("CONNECTS", 1000)
	par := envInt("PARALLEL", 1000)

	n := inet.Start(t)
	n.HTTP(t, "198.51.100.10", 80, inet.Bytes())
	n.TCP(t, "198.51.100.11", 9000, "")
	n.SetA("dl.bench.test", "198.51.100.10")
	n.SetA("tcp.bench.test", "198.51.100.11")
	for r := 0; r < rounds; r++ {
		for i := 0; i <= 100; i++ {
			n.SetA(fmt.Sprintf("u%d-%d.bench.test", r, i), "198.51.100.10")
		}
	}
	dir := project(t, "benchgate")
	// max_connections: the parallel figure opens PARALLEL connections at once, above the
	// default the daemon derives from memory_max.
	os.WriteFile(filepath.Join(dir, "moat.toml"), []byte(fmt.Sprintf("[network]\nuse = [\"none\"]\nallow = [\"*.bench.test\"]\nmax_connections = %d\n", par+100)), 0o644)
	probe := benchProbe(t, dir)
	env := []string{"MOAT_UPSTREAM_DNS=" + n.DNS.String()}
	if r := moat(t, dir, env, "up", "--name", "benchgate"); r.code != 0 {
		t.Fatalf("moat up: %s", r.stderr)
	}
	t.Cleanup(func() { moat(t, dir, nil, "destroy", "--yes", "benchgate") })
	daemonPID := sandboxDaemon(t, "benchgate")
	netns := sandboxNetns(t, daemonPID)
	netDev := filepath.Join(filepath.Dir(filepath.Dir(netns)), "net", "dev")
	bare := startBare(t, n)
	bared := func(args ...string) map[string]float64 {
		return decode(t, bare.run(t, append([]string{probe}, args...)...))
	}

	direct := func(args ...string) map[string]float64 {
		out, err := exec.Command(probe, args...).Output()
		if err != nil {
			t.Fatalf("direct %v: %v", args, err)
		}
		return decode(t, out)
	}
	gated := func(args ...string) map[string]float64 {
		r := moat(t, dir, nil, append([]string{"exec", "benchgate", "--", probe}, args...)...)
		if r.code != 0 {
			t.Fatalf("gated %v: %s", args, r.stderr)
		}
		return decode(t, []byte(r.stdout))
	}
	// tapped runs a gated probe while tap0 is captured and returns the
	// gate's turnaround times seen there.
	tapped := func(args ...string) (map[string]float64, tapTimes) {
		c := captureTAP(t, netns)
		defer c.close()
		m := gated(args...)
		return m, c.times(t)
	}
	bytes := strconv.Itoa(sizeMiB << 20)
	kib := strconv.Itoa(readKiB)
	var dlD, dlG, dlL, dlB []float64
	var cpuDaemon, cpuRuntime, cpuUp []float64 // CPU seconds per GiB of the gated download
	var toGuest, fromGuest []float64           // tap0 frames per MiB of the gated download
	var cD50, cD99, cG50, cG99, cL50, cL99, cT50, cT99, cB50, cB99 []float64
	var pD, pG, pL, pRe, pB []float64
	var dnsC50, dnsC99, dnsL50, dnsT50, dnsT99, dnsD50, dnsU50, dnsUT50, dnsB50, dnsB99 []float64
	var rfD50, rfL50, rfP50, rfP99, rfPT50, rfPT99, rfC50, rfCT50, rfCT99 []float64
	load := func() string {
		b, _ := os.ReadFile("/proc/loadavg")
		return strings.Join(strings.Fields(string(b))[:3], " ")
	}
	loadBefore := load()
	for r := 0; r < rounds; r++ {
		d := direct("get", "http://198.51.100.10/bytes?n="+bytes, kib)
		before, upBefore, fBefore := treeCPU(daemonPID), selfCPU(), tapFrames(t, netDev)
		g := gated("get", "http://dl.bench.test/bytes?n="+bytes, kib)
		after, upAfter, fAfter := treeCPU(daemonPID), selfCPU(), tapFrames(t, netDev)
		gib := g["bytes"] / (1 << 30)
		cpuDaemon = append(cpuDaemon, (after.daemon-before.daemon).Seconds()/gib)
		cpuRuntime = append(cpuRuntime, (after.rest-before.rest).Seconds()/gib)
		cpuUp = append(cpuUp, (upAfter-upBefore).Seconds()/gib)
		mib := g["bytes"] / (1 << 20)
		toGuest = append(toGuest, float64(fAfter.toGuest-fBefore.toGuest)/mib)
		fromGuest = append(fromGuest, float64(fAfter.fromGuest-fBefore.fromGuest)/mib)
		l := gated("get", "http://local/bytes?n="+bytes, kib)
		dlD = append(dlD, d["bytes"]/d["seconds"]/(1<<20))
		dlG = append(dlG, g["bytes"]/g["seconds"]/(1<<20))
		dlL = append(dlL, l["bytes"]/l["seconds"]/(1<<20))
		b := bared("get", "http://198.51.100.10/bytes?n="+bytes, kib)
		dlB = append(dlB, b["bytes"]/b["seconds"]/(1<<20))

		d = direct("connect", "198.51.100.11:9000", strconv.Itoa(connects))
		g, tt := tapped("connect", "tcp.bench.test:9000", strconv.Itoa(connects))
		l = gated("connect", "local:0", strconv.Itoa(connects))
		cD50, cD99 = append(cD50, d["p50_us"]), append(cD99, d["p99_us"])
		cG50, cG99 = append(cG50, g["p50_us"]), append(cG99, g["p99_us"])
		cL50, cL99 = append(cL50, l["p50_us"]), append(cL99, l["p99_us"])
		cT50, cT99 = append(cT50, pctUS(tt.synAck, 0.5)), append(cT99, pctUS(tt.synAck, 0.99))
		b = bared("connect", "198.51.100.11:9000", strconv.Itoa(connects))
		cB50, cB99 = append(cB50, b["p50_us"]), append(cB99, b["p99_us"])

		d = direct("parallel", "198.51.100.11:9000", strconv.Itoa(par))
		g = gated("parallel", "tcp.bench.test:9000", strconv.Itoa(par))
		l = gated("parallel", "local:0", strconv.Itoa(par))
		if d["failed"]+g["failed"] > 0 {
			t.Errorf("parallel connects failed: direct %v, gated %v", d["failed"], g["failed"])
		}
		pD, pG, pL, pRe = append(pD, d["ms"]), append(pG, g["ms"]), append(pL, l["ms"]), append(pRe, g["retrans"])
		b = bared("parallel", "198.51.100.11:9000", strconv.Itoa(par))
		if b["failed"] > 0 {
			t.Errorf("parallel connects failed in the bare sandbox: %v", b["failed"])
		}
		pB = append(pB, b["ms"])

		g, tt = tapped("dns", "10.88.0.1:53", "dl.bench.test", "1000")
		dnsC50, dnsC99 = append(dnsC50, g["p50_us"]), append(dnsC99, g["p99_us"])
		dnsT50, dnsT99 = append(dnsT50, pctUS(tt.dns, 0.5)), append(dnsT99, pctUS(tt.dns, 0.99))
		l = gated("dns", "local", "dl.bench.test", "1000")
		dnsL50 = append(dnsL50, l["p50_us"])
		b = bared("dns", n.DNS.String(), "dl.bench.test", "1000")
		dnsB50, dnsB99 = append(dnsB50, b["p50_us"]), append(dnsB99, b["p99_us"])
		d = direct("dns", n.DNS.String(), "u0-%d.bench.test", "100")
		dnsD50 = append(dnsD50, d["p50_us"])
		g, tt = tapped("dns", "10.88.0.1:53", fmt.Sprintf("u%d-%%d.bench.test", r), "100")
		dnsU50, dnsUT50 = append(dnsU50, g["p50_us"]), append(dnsUT50, pctUS(tt.dns, 0.5))

		// Refusals: a name the policy does not allow (its pool address,
		// decided by the forwarder), an address in a refused class (reset
		// on the packet path), a closed port on the host and in the guest.
		d = direct("refused", "198.51.100.11:9", "300")
		g, tt = tapped("refused", "denied.example.test:9000", "300")
		rfD50, rfP50, rfP99 = append(rfD50, d["p50_us"]), append(rfP50, g["p50_us"]), append(rfP99, g["p99_us"])
		rfPT50, rfPT99 = append(rfPT50, pctUS(tt.rst, 0.5)), append(rfPT99, pctUS(tt.rst, 0.99))
		g, tt = tapped("refused", "10.0.0.1:80", "300")
		rfC50, rfCT50, rfCT99 = append(rfC50, g["p50_us"]), append(rfCT50, pctUS(tt.rst, 0.5)), append(rfCT99, pctUS(tt.rst, 0.99))
		l = gated("refused", "local:1", "300")
		rfL50 = append(rfL50, l["p50_us"])
	}
	m := median
	t.Logf("rounds: %d, medians; load %s before, %s after (2 CPUs)", rounds, loadBefore, load())
	t.Logf("download %d MiB, %d KiB reads   gate %5.0f MiB/s   direct %5.0f MiB/s   ratio %.2f (target >= 0.5)   guest lo %5.0f MiB/s",
		sizeMiB, readKiB, m(dlG), m(dlD), m(dlG)/m(dlD), m(dlL))
	t.Logf("                  bare runsc %5.0f MiB/s   ratio %.2f (gVisor's own network to the same upstream, no gate)", m(dlB), m(dlB)/m(dlD))
	t.Logf("                  CPU s/GiB through the gate: daemon %.2f   runsc and guest %.2f   test upstream %.2f (the probe's CLI session included in runsc and guest)",
		m(cpuDaemon), m(cpuRuntime), m(cpuUp))
	t.Logf("                  tap0 frames per MiB: %.1f to the guest, %.1f from it (ACKs)", m(toGuest), m(fromGuest))
	t.Logf("connect x%d       gate p50 %5.0f us p99 %5.0f us   direct p50 %5.0f us p99 %5.0f us   added p50 %.2f ms (target <= 1 ms)",
		connects, m(cG50), m(cG99), m(cD50), m(cD99), (m(cG50)-m(cD50))/1000)
	t.Logf("                  tap0 SYN->SYN-ACK p50 %5.0f us p99 %5.0f us (decision, upstream dial, both TAP hops)   guest lo p50 %5.0f us p99 %5.0f us",
		m(cT50), m(cT99), m(cL50), m(cL99))
	t.Logf("                  bare runsc p50 %5.0f us p99 %5.0f us   added p50 %.2f ms (gVisor's own network, no gate)",
		m(cB50), m(cB99), (m(cB50)-m(cD50))/1000)
	t.Logf("parallel x%d      gate %6.1f ms   direct %6.1f ms   ratio %.2f (target <= 2)   guest TCP retransmits %.0f (target 0)   guest lo %6.1f ms",
		par, m(pG), m(pD), m(pG)/m(pD), m(pRe), m(pL))
	t.Logf("                  bare runsc %6.1f ms   ratio %.2f (gVisor's own network, no gate)", m(pB), m(pB)/m(pD))
	t.Logf("dns cached        gate p50 %4.0f us p99 %4.0f us (target p50 <= 300 us)   tap0 p50 %4.0f us p99 %4.0f us   guest lo p50 %4.0f us",
		m(dnsC50), m(dnsC99), m(dnsT50), m(dnsT99), m(dnsL50))
	t.Logf("                  bare runsc p50 %4.0f us p99 %4.0f us (gVisor's own network, no gate: the test's DNS server answers from memory)", m(dnsB50), m(dnsB99))
	t.Logf("dns uncached      gate p50 %4.0f us   over cached %4.0f us (target <= one upstream round trip: direct p50 %4.0f us)   tap0 p50 %4.0f us",
		m(dnsU50), m(dnsU50)-m(dnsC50), m(dnsD50), m(dnsUT50))
	t.Logf("refused, policy   gate p50 %4.0f us p99 %4.0f us   tap0 SYN->RST p50 %4.0f us p99 %4.0f us (target < 400 us)",
		m(rfP50), m(rfP99), m(rfPT50), m(rfPT99))
	t.Logf("refused, class    gate p50 %4.0f us   tap0 SYN->RST p50 %4.0f us p99 %4.0f us   closed port: direct p50 %4.0f us, guest lo p50 %4.0f us",
		m(rfC50), m(rfCT50), m(rfCT99), m(rfD50), m(rfL50))
	// Which targets gVisor alone, with no gate, already misses on this host.
	var floor []string
	if r := m(dlB) / m(dlD); r < 0.5 {
		floor = append(floor, fmt.Sprintf("download %.2f of direct (>= 0.5)", r))
	}
	if a := (m(cB50) - m(cD50)) / 1000; a > 1 {
		floor = append(floor, fmt.Sprintf("connect +%.2f ms (<= 1)", a))
	}
	if r := m(pB) / m(pD); r > 2 {
		floor = append(floor, fmt.Sprintf("parallel %.2fx (<= 2)", r))
	}
	if v := m(dnsB50); v > 300 {
		floor = append(floor, fmt.Sprintf("dns p50 %.0f us (<= 300)", v))
	}
	if len(floor) == 0 {
		t.Logf("floor: bare runsc meets every target")
	} else {
		t.Logf("floor: bare runsc, with no gate, already misses: %s", strings.Join(floor, ", "))
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func pctUS(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[int(float64(len(s)-1)*p)].Microseconds())
}

func decode(t *testing.T, b []byte) map[string]float64 {
	t.Helper()
	var m map[string]float64
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("probe output %q: %v", b, err)
	}
	return m
}

// benchProbe builds the benchmark probe static into the project directory,
// which the guest sees at the same path.
func benchProbe(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "benchprobe")
	cmd := exec.Command("go", "build", "-o", out, "./benchprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building benchprobe: %v\n%s", err, b)
	}
	return out
}

// sandboxDaemon is the pid of the sandbox's daemon.
func sandboxDaemon(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moatHome, "state", "sandboxes", name, "daemon.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("daemon.pid: %v", err)
	}
	return pid
}

// cpuSplit is the CPU time used by a daemon itself and by every process
// below it (shim, runsc's sandbox, gofer and stub processes, where
// the guest's own code runs under systrap).
type cpuSplit struct{ daemon, rest time.Duration }

// clockTick is USER_HZ, the unit of /proc/PID/stat's times (100 on Linux).
const clockTick = 10 * time.Millisecond

// procStat is a process's user and system time, and its parent.
func procStat(pid int) (time.Duration, int, bool) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid ... utime(14) stime(15)
	f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, _ := strconv.Atoi(f[1])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stm, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+stm) * clockTick, ppid, true
}

func treeCPU(daemon int) cpuSplit {
	var s cpuSplit
	s.daemon, _, _ = procStat(daemon)
	parent := map[int]int{}
	cpu := map[int]time.Duration{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(p))
		if c, pp, ok := procStat(pid); ok {
			parent[pid], cpu[pid] = pp, c
		}
	}
	for pid, c := range cpu {
		for q, n := parent[pid], 0; q > 1 && n < 64; q, n = parent[q], n+1 {
			if q == daemon {
				s.rest += c
				break
			}
		}
	}
	return s
}

// selfCPU is this test process's CPU time: the test "internet"'s servers.
func selfCPU() time.Duration {
	c, _, _ := procStat(os.Getpid())
	return c
}

// frameCounts are tap0's frame counters, as the host kernel counts them.
type frameCounts struct{ toGuest, fromGuest int64 }

// tapFrames reads tap0's counters from a /proc/PID/net/dev in the sandbox's
// network namespace. The kernel's tap0 receives what the guest (runsc)
// sends and transmits what the daemon writes to its fd... seen from the
// TAP device's side: the daemon's writes are the device's "receive".
func tapFrames(t *testing.T, netDev string) frameCounts {
	t.Helper()
	b, err := os.ReadFile(netDev)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != "tap0" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 10 {
			break
		}
		// rx bytes, rx packets, ... (8 fields), tx bytes, tx packets
		rx, _ := strconv.ParseInt(f[1], 10, 64)
		tx, _ := strconv.ParseInt(f[9], 10, 64)
		return frameCounts{toGuest: rx, fromGuest: tx}
	}
	t.Fatalf("no tap0 in %s", netDev)
	return frameCounts{}
}

// sandboxNetns is the network namespace holding the sandbox's tap0: the
// shim's, a child of the daemon.
func sandboxNetns(t *testing.T, daemon int) string {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(p))
		if _, ppid, ok := procStat(pid); !ok || ppid != daemon {
			continue
		}
		if cmd, _ := os.ReadFile(filepath.Join(p, "cmdline")); strings.Contains(string(cmd), "__shim") {
			return filepath.Join(p, "ns", "net")
		}
	}
	t.Fatalf("no shim under daemon %d", daemon)
	return ""
}

// tapCapture is a packet socket on tap0. Nothing reads it while the probe
// runs: frames wait in its buffer with the kernel's timestamp of when they
// crossed tap0, so the capture adds no wake-ups to what it measures.
type tapCapture struct{ fd int }

func captureTAP(t *testing.T, netns string) *tapCapture {
	t.Helper()
	var fd int
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Never unlocked: the thread enters the sandbox's namespace and
		// exits with this goroutine.
		runtime.LockOSThread()
		ns, e := unix.Open(netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if e != nil {
			err = e
			return
		}
		defer unix.Close(ns)
		if err = unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			return
		}
		ifi, e := net.InterfaceByName("tap0")
		if e != nil {
			err = e
			return
		}
		all := int(htons(unix.ETH_P_ALL))
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, all); err != nil {
			return
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
		err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index})
	}()
	<-done
	if err != nil {
		t.Fatalf("capturing tap0: %v", err)
	}
	return &tapCapture{fd: fd}
}

func (c *tapCapture) close() { unix.Close(c.fd) }

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// tapTimes are the gate's turnaround times: guest's SYN to the gate's
// SYN-ACK, SYN to RST, DNS query to its answer.
type tapTimes struct{ synAck, rst, dns []time.Duration }

type flowKey struct {
	sport, dport uint16
	id           uint16 // DNS ID
}

// times drains the capture and pairs requests with answers.
func (c *tapCapture) times(t *testing.T) tapTimes {
	var out tapTimes
	syn := map[flowKey]time.Time{}
	query := map[flowKey]time.Time{}
	buf := make([]byte, 256)
	oob := make([]byte, 128)
	frames, drops := 0, 0
	for {
		n, oobn, _, from, err := unix.Recvmsg(c.fd, buf, oob, unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		if err != nil {
			break
		}
		frames++
		var ts time.Time
		if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, cm := range cms {
				if cm.Header.Level == unix.SOL_SOCKET && cm.Header.Type == unix.SO_TIMESTAMPNS && len(cm.Data) >= 16 {
					ts = time.Unix(int64(binary.LittleEndian.Uint64(cm.Data)), int64(binary.LittleEndian.Uint64(cm.Data[8:])))
				}
			}
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ts.IsZero() {
			continue
		}
		fromGuest := ll.Pkttype == unix.PACKET_OUTGOING // the guest's runsc sends on tap0; the gate's frames arrive
		f := buf[:min(n, len(buf))]
		if len(f) < 14+20 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
			continue
		}
		ip := f[14:]
		ihl := int(ip[0]&0x0f) * 4
		if len(ip) < ihl+8 {
			continue
		}
		l4 := ip[ihl:]
		sport, dport := binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
		switch ip[9] {
		case 6:
			if len(l4) < 14 {
				continue
			}
			flags := l4[13]
			if fromGuest && flags&0x12 == 0x02 { // SYN
				k := flowKey{sport: sport, dport: dport}
				if _, seen := syn[k]; !seen { // a retransmitted SYN keeps the first time
					syn[k] = ts
				}
			}
			if !fromGuest {
				k := flowKey{sport: dport, dport: sport}
				if t0, ok := syn[k]; ok {
					switch {
					case flags&0x12 == 0x12:
						out.synAck = append(out.synAck, ts.Sub(t0))
					case flags&0x04 != 0:
						out.rst = append(out.rst, ts.Sub(t0))
					}
					delete(syn, k)
				}
			}
		case 17:
			if len(l4) < 8+2 {
				continue
			}
			id := binary.BigEndian.Uint16(l4[8:])
			if fromGuest && dport == 53 {
				query[flowKey{sport: sport, id: id}] = ts
			}
			if !fromGuest && sport == 53 {
				k := flowKey{sport: dport, id: id}
				if t0, ok := query[k]; ok {
					out.dns = append(out.dns, ts.Sub(t0))
					delete(query, k)
				}
			}
		}
	}
	if st, err := unix.GetsockoptTpacketStats(c.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
		drops = int(st.Drops)
	}
	if drops > 0 {
		t.Logf("tap0 capture: %d frames, %d dropped by the kernel", frames, drops)
	}
	return out
}
