package gatecni

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// TestMain runs the test binary as the plugin itself when the test execs
// it with MOAT_CNI_TEST_PLUGIN set, so ADD, CHECK and DEL go through
// skel's real environment-and-stdin protocol, as a runtime drives them.
func TestMain(m *testing.M) {
	if os.Getenv("MOAT_CNI_TEST_PLUGIN") == "1" {
		skel.PluginMainFuncs(Funcs(os.Stderr), Versions, "moat-cni test")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Addresses of the test's two namespaces: "node" stands for the node (and,
// on its loopback, for the gate's Service address and another host),
// "pod" for the pod.
var (
	tNodeIP  = netip.MustParseAddr("10.99.0.1")
	tPodIP   = netip.MustParseAddr("10.99.0.2")
	tSpoofIP = netip.MustParseAddr("10.99.0.3")
	tGateIP  = netip.MustParseAddr("10.99.1.53")
	tOtherIP = netip.MustParseAddr("10.99.1.7")
	tNode6   = netip.MustParseAddr("fd99::1")
	tPod6    = netip.MustParseAddr("fd99::2")
)

type testNet struct {
	node, pod string // namespace names under /run/netns
	nodeMAC   net.HardwareAddr
}

func newTestNet(t *testing.T) *testNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces; run as root (CI does)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip to make network namespaces")
	}
	n := &testNet{
		node: fmt.Sprintf("moat-cni-%d-node", os.Getpid()),
		pod:  fmt.Sprintf("moat-cni-%d-pod", os.Getpid()),
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{n.node, n.pod} {
		run("netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	run("-n", n.node, "link", "add", "host0", "type", "veth", "peer", "name", "eth0", "netns", n.pod)
	run("-n", n.node, "addr", "add", tNodeIP.String()+"/24", "dev", "host0")
	run("-n", n.node, "addr", "add", tNode6.String()+"/64", "dev", "host0", "nodad")
	run("-n", n.node, "addr", "add", tGateIP.String()+"/32", "dev", "lo")
	run("-n", n.node, "addr", "add", tOtherIP.String()+"/32", "dev", "lo")
	run("-n", n.node, "link", "set", "lo", "up")
	run("-n", n.node, "link", "set", "host0", "up")
	run("-n", n.pod, "addr", "add", tPodIP.String()+"/24", "dev", "eth0")
	run("-n", n.pod, "addr", "add", tPod6.String()+"/64", "dev", "eth0", "nodad")
	run("-n", n.pod, "link", "set", "lo", "up")
	run("-n", n.pod, "link", "set", "eth0", "up")
	run("-n", n.pod, "route", "add", "default", "via", tNodeIP.String())
	if err := n.in(n.node, func() error {
		l, err := net.InterfaceByName("host0")
		if err == nil {
			n.nodeMAC = l.HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *testNet) nsPath(ns string) string { return "/run/netns/" + ns }

// in runs fn on a thread inside namespace ns: sockets fn makes stay there.
func (n *testNet) in(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(home)
		target, err := unix.Open(n.nsPath(ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		ferr := fn()
		if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, err) // the thread stays locked and goes with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// listeners on the node side: TCP accepts and UDP datagrams, each noted by
// the address it arrived at and the source it came from.
type listeners struct {
	mu   sync.Mutex
	seen []string // "tcp 10.99.1.53:443 from 10.99.0.2"
}

func (l *listeners) note(s string) {
	l.mu.Lock()
	l.seen = append(l.seen, s)
	l.mu.Unlock()
}

func (l *listeners) reset() {
	l.mu.Lock()
	l.seen = nil
	l.mu.Unlock()
}

func (l *listeners) saw(prefix string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.seen {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func (n *testNet) listen(t *testing.T) *listeners {
	t.Helper()
	ls := &listeners{}
	tcp := []string{"10.99.1.53:443", "10.99.1.53:80", "10.99.1.53:53", "10.99.1.53:8080", "10.99.1.7:443", "10.99.0.1:443", "[fd99::1]:443"}
	udp := []string{"10.99.1.53:53", "10.99.1.7:53", "10.99.0.1:53"}
	err := n.in(n.node, func() error {
		for _, a := range tcp {
			l, err := net.Listen("tcp", a)
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					ls.note(fmt.Sprintf("tcp %s from %s", a, c.RemoteAddr().(*net.TCPAddr).IP))
					c.Write([]byte("ok"))
					c.Close()
				}
			}()
		}
		for _, a := range udp {
			pc, err := net.ListenPacket("udp", a)
			if err != nil {
				return err
			}
			t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 1500)
				for {
					k, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					ls.note(fmt.Sprintf("udp %s from %s", a, from.(*net.UDPAddr).IP))
					pc.WriteTo(buf[:k], from)
				}
			}()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listening in the node namespace: %v", err)
	}
	return ls
}

// reach says whether a connection from the pod namespace gets an answer:
// TCP, the listener's "ok"; UDP, the echo of a datagram.
func (n *testNet) reach(network, addr string) error {
	return n.in(n.pod, func() error {
		c, err := net.DialTimeout(network, addr, 700*time.Millisecond)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(700 * time.Millisecond))
		if network == "udp" {
			if _, err := c.Write([]byte("ping")); err != nil {
				return err
			}
		}
		buf := make([]byte, 8)
		_, err = c.Read(buf)
		return err
	})
}

// sendRaw sends one UDP datagram from the pod namespace as a gVisor
// sandbox sends everything: a whole Ethernet frame written to an AF_PACKET
// socket bound to eth0, past the namespace's IP stack and its iptables.
func (n *testNet) sendRaw(src, dst netip.Addr, dport uint16) error {
	return n.in(n.pod, func() error {
		eth0, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		const ethPAll = 0x0003
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// Bound as runsc binds its socket (runsc/sandbox/network.go).
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(ethPAll), Ifindex: eth0.Index}); err != nil {
			return err
		}
		return unix.Sendto(fd, udpFrame(eth0.HardwareAddr, n.nodeMAC, src, dst, 40000, dport, []byte("raw")), 0, nil)
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// udpFrame is an Ethernet frame holding an IPv4 UDP datagram (UDP
// checksum 0: none, which IPv4 allows).
func udpFrame(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	var b bytes.Buffer
	b.Write(dstMAC)
	b.Write(srcMAC)
	b.Write([]byte{0x08, 0x00})
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	ip[8] = 64
	ip[9] = 17
	copy(ip[12:], src.AsSlice())
	copy(ip[16:], dst.AsSlice())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	b.Write(ip)
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	b.Write(udp)
	b.Write(payload)
	return b.Bytes()
}

// testConf is a conflist's moat-cni entry with the bridge plugin's result
// for the test's pod as prevResult.
func (n *testNet) testConf(t *testing.T, namespaces []string) []byte {
	t.Helper()
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "moat",
		"type":       "moat-cni",
		"gate":       map[string]any{"addresses": []string{tGateIP.String()}, "ports": []string{"53/udp", "53/tcp", "80/tcp", "443/tcp"}},
		"namespaces": namespaces,
		"prevResult": map[string]any{
			"cniVersion": "1.0.0",
			"interfaces": []map[string]any{
				{"name": "moat-cni0", "mac": "02:00:00:00:00:01"},
				{"name": "vethtest", "mac": "02:00:00:00:00:02"},
				{"name": "eth0", "mac": "02:00:00:00:00:03", "sandbox": n.nsPath(n.pod)},
			},
			"ips": []map[string]any{{"interface": 2, "address": tPodIP.String() + "/24", "gateway": tNodeIP.String()}},
		},
	}
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// plugin runs the test binary as the plugin with verb for the pod.
func (n *testNet) plugin(verb, ifName, k8sNamespace string, stdin []byte) (stdout []byte, err error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(),
		"MOAT_CNI_TEST_PLUGIN=1",
		"CNI_COMMAND="+verb,
		"CNI_CONTAINERID=test-"+n.pod,
		"CNI_NETNS="+n.nsPath(n.pod),
		"CNI_IFNAME="+ifName,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+k8sNamespace+";K8S_POD_NAME=probe",
		"CNI_PATH=/nonexistent",
	)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s: %v: stdout %s stderr %s", verb, err, out.Bytes(), errb.Bytes())
	}
	return out.Bytes(), nil
}

type probe struct {
	name, network, addr string
	seen                string // what the node side notes when it arrives
}

var (
	gateProbes = []probe{
		{"gate 443/tcp", "tcp", "10.99.1.53:443", "tcp 10.99.1.53:443 from 10.99.0.2"},
		{"gate 80/tcp", "tcp", "10.99.1.53:80", "tcp 10.99.1.53:80 from 10.99.0.2"},
		{"gate 53/tcp", "tcp", "10.99.1.53:53", "tcp 10.99.1.53:53 from 10.99.0.2"},
		{"gate 53/udp", "udp", "10.99.1.53:53", "udp 10.99.1.53:53 from 10.99.0.2"},
	}
	deadProbes = []probe{
		{"gate on another port", "tcp", "10.99.1.53:8080", "tcp 10.99.1.53:8080"},
		{"another address", "tcp", "10.99.1.7:443", "tcp 10.99.1.7:443"},
		{"another address's DNS", "udp", "10.99.1.7:53", "udp 10.99.1.7:53"},
		{"the node", "tcp", "10.99.0.1:443", "tcp 10.99.0.1:443"},
		{"the node's DNS", "udp", "10.99.0.1:53", "udp 10.99.0.1:53"},
		{"IPv6", "tcp", "[fd99::1]:443", "tcp [fd99::1]:443"},
	}
)

// TestFenceInNamespace is ADD, CHECK and DEL of a gated pod in namespaces
// the test makes, with the pod's traffic sent both through the kernel's
// stack (a runc pod) and as raw frames on an AF_PACKET socket (a gVisor
// pod): before ADD everything passes, after it only the gate does, after
// DEL everything passes again.
func TestFenceInNamespace(t *testing.T) {
	n := newTestNet(t)
	ls := n.listen(t)
	conf := n.testConf(t, []string{"agents"})

	// Without the fence every probe gets through: the test can fail.
	for _, p := range append(append([]probe{}, gateProbes...), deadProbes...) {
		if err := n.reach(p.network, p.addr); err != nil {
			t.Fatalf("before ADD, %s (%s %s) is unreachable, so the test proves nothing: %v", p.name, p.network, p.addr, err)
		}
	}
	for _, dst := range []netip.Addr{tGateIP, tOtherIP} {
		if err := n.sendRaw(tPodIP, dst, 53); err != nil {
			t.Fatalf("sending a raw frame: %v", err)
		}
	}
	if err := n.sendRaw(tSpoofIP, tGateIP, 53); err != nil {
		t.Fatalf("sending a raw frame: %v", err)
	}
	waitSeen(t, ls, "udp 10.99.1.7:53 from 10.99.0.2", "udp 10.99.1.53:53 from 10.99.0.3")

	out, err := n.plugin("ADD", "eth0", "agents", conf)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		IPs []struct{ Address string } `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != 1 || res.IPs[0].Address != "10.99.0.2/24" {
		t.Fatalf("ADD's result is not the previous result passed on: %s (%v)", out, err)
	}
	ls.reset()

	for _, p := range gateProbes {
		if err := n.reach(p.network, p.addr); err != nil {
			t.Errorf("fenced: %s (%s %s) is unreachable: %v", p.name, p.network, p.addr, err)
		}
	}
	for _, p := range deadProbes {
		if err := n.reach(p.network, p.addr); err == nil {
			t.Errorf("fenced: %s (%s %s) answered", p.name, p.network, p.addr)
		}
	}
	// A frame the egress hook drops fails the sender's write with ENOBUFS
	// (the device's queue reports the drop), as runsc's write would.
	for _, f := range []struct{ src, dst netip.Addr }{{tPodIP, tOtherIP}, {tSpoofIP, tGateIP}} {
		if err := n.sendRaw(f.src, f.dst, 53); err != nil && !errors.Is(err, unix.ENOBUFS) {
			t.Fatal(err)
		}
	}
	if err := n.sendRaw(tPodIP, tGateIP, 53); err != nil {
		t.Fatal(err)
	}
	// The allowed raw frame arrives; once it has, the two sent before it
	// on the same queue would have too.
	waitSeen(t, ls, "udp 10.99.1.53:53 from 10.99.0.2")
	for _, p := range deadProbes {
		if ls.saw(p.seen) {
			t.Errorf("fenced: %s got a packet through (%s)", p.name, p.seen)
		}
	}
	for _, s := range []string{"udp 10.99.1.7:53", "udp 10.99.1.53:53 from 10.99.0.3"} {
		if ls.saw(s) {
			t.Errorf("fenced: a raw frame got through: %s", s)
		}
	}
	drops, err := Drops(n.nsPath(n.pod))
	if err != nil {
		t.Fatal(err)
	}
	if drops[chainEgress] == 0 {
		t.Errorf("the egress chain's drop counter is 0 after dropping probes: %v", drops)
	}

	if _, err := n.plugin("CHECK", "eth0", "agents", conf); err != nil {
		t.Errorf("CHECK of a fenced pod: %v", err)
	}
	// ADD again (a runtime's retry) replaces the fence: still one of each.
	if _, err := n.plugin("ADD", "eth0", "agents", conf); err != nil {
		t.Errorf("a second ADD: %v", err)
	}
	if _, err := n.plugin("CHECK", "eth0", "agents", conf); err != nil {
		t.Errorf("CHECK after a second ADD: %v", err)
	}

	if _, err := n.plugin("DEL", "eth0", "agents", conf); err != nil {
		t.Fatal(err)
	}
	if _, err := n.plugin("CHECK", "eth0", "agents", conf); err == nil {
		t.Errorf("CHECK passed after DEL removed the fence")
	}
	if err := n.reach("tcp", "10.99.1.7:443"); err != nil {
		t.Errorf("after DEL, another address is still unreachable: %v", err)
	}
	if _, err := n.plugin("DEL", "eth0", "agents", conf); err != nil {
		t.Errorf("a second DEL: %v", err)
	}
}

// TestUngatedPodUntouched: a pod outside the gated namespaces gets the
// previous result and no table.
func TestUngatedPodUntouched(t *testing.T) {
	n := newTestNet(t)
	n.listen(t)
	conf := n.testConf(t, []string{"agents"})
	if _, err := n.plugin("ADD", "eth0", "default", conf); err != nil {
		t.Fatal(err)
	}
	if err := n.reach("tcp", "10.99.1.7:443"); err != nil {
		t.Errorf("an ungated pod cannot reach another address: %v", err)
	}
	if tableIn(t, n.nsPath(n.pod)) {
		t.Errorf("an ungated pod has a fence")
	}
}

// TestAddFailsClosed: when the fence cannot be installed, ADD fails and
// leaves nothing half-made.
func TestAddFailsClosed(t *testing.T) {
	n := newTestNet(t)
	conf := n.testConf(t, []string{"agents"})
	// No such interface in the namespace: the kernel refuses the chains.
	if _, err := n.plugin("ADD", "nosuch0", "agents", bytes.Replace(conf, []byte(`"name":"eth0"`), []byte(`"name":"nosuch0"`), 1)); err == nil {
		t.Errorf("ADD on an interface that is not there succeeded")
	} else if !strings.Contains(err.Error(), "refusing its network") {
		t.Errorf("ADD's error does not say the pod's network is refused: %v", err)
	}
	if tableIn(t, n.nsPath(n.pod)) {
		t.Errorf("a failed ADD left table %s behind", TableName)
	}
	// No prevResult: moat-cni was listed first in the conflist.
	var m map[string]any
	json.Unmarshal(conf, &m)
	delete(m, "prevResult")
	noPrev, _ := json.Marshal(m)
	if _, err := n.plugin("ADD", "eth0", "agents", noPrev); err == nil || !strings.Contains(err.Error(), "prevResult") {
		t.Errorf("ADD without prevResult: %v", err)
	}
	// A pod namespace that is not there.
	cmdErr := func() error {
		saved := n.pod
		n.pod = "moat-cni-absent"
		defer func() { n.pod = saved }()
		_, err := n.plugin("ADD", "eth0", "agents", conf)
		return err
	}()
	if cmdErr == nil {
		t.Errorf("ADD into a namespace that does not exist succeeded")
	}
}

func tableIn(t *testing.T, nsPath string) bool {
	t.Helper()
	found := false
	err := withConn(nsPath, func(c *nftables.Conn, _ *os.File) error {
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyNetdev)
		for _, tb := range tables {
			found = found || tb.Name == TableName
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func waitSeen(t *testing.T, ls *listeners, want ...string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for _, w := range want {
		for !ls.saw(w) {
			if time.Now().After(deadline) {
				ls.mu.Lock()
				defer ls.mu.Unlock()
				t.Fatalf("the node side never saw %q; it saw %q", w, ls.seen)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestIptablesMissesRawFrames is why the fence is on the netdev hooks: an
// iptables rule in the pod's namespace that drops everything it sends
// stops the kernel's own sockets but not a frame written to an AF_PACKET
// socket, the way runsc's netstack sends every packet.
func TestIptablesMissesRawFrames(t *testing.T) {
	n := newTestNet(t)
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("needs iptables to show what it does not see")
	}
	ls := n.listen(t)
	if out, err := exec.Command("ip", "netns", "exec", n.pod, "iptables", "-A", "OUTPUT", "-j", "DROP").CombinedOutput(); err != nil {
		t.Fatalf("iptables in the pod namespace: %v: %s", err, out)
	}
	if err := n.reach("udp", "10.99.1.7:53"); err == nil {
		t.Fatalf("the pod's kernel socket got through iptables' OUTPUT drop")
	}
	if err := n.sendRaw(tPodIP, tOtherIP, 53); err != nil {
		t.Fatal(err)
	}
	waitSeen(t, ls, "udp 10.99.1.7:53 from 10.99.0.2")
}
