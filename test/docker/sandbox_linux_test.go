package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"moat.dev/moat/internal/dockerrt/engine"
)

const policy = `[sandbox]
name = "NAME"
image = "IMAGE"
runtime = "docker"

[network]
allow = ["allowed.test", "plain.test", "banner.test:2222"]
inspect = true
trust = ["WS/upstream-ca.pem"]

[secrets.API_TOKEN]
from = "file:WS/token"
hosts = ["allowed.test"]

[secrets.CANARY]
from = "env:MOAT_DOCKER_CANARY"
hosts = ["allowed.test"]

[hooks]
on_create = ["echo created-as-$(id -u)-with-${CANARY:+placeholder} >> WS/hooks.log"]
on_up = ["echo up >> WS/hooks.log"]
`

// TestDockerSandbox runs one sandbox through every check: a cold start
// costs seconds, the checks themselves little.
func TestDockerSandbox(t *testing.T) {
	caPEM, leaf := testCA(t)
	secret := fmt.Sprintf("moat-docker-test-secret-%d", time.Now().UnixNano())
	s := newSandbox(t, policy, map[string][]byte{"upstream-ca.pem": caPEM, "token": []byte(secret + "\n")})
	// An env: secret: in moat's environment only, pushed to the gate
	// over its control socket.
	canary := fmt.Sprintf("moat-docker-canary-%d", time.Now().UnixNano())
	s.env = append(s.env, "MOAT_DOCKER_CANARY="+canary)
	up := startUpstream(t, leaf)
	start := time.Now()
	s.must(t, "true")
	t.Logf("cold start and a session: %s", time.Since(start).Round(time.Millisecond))
	ctx := context.Background()
	intNet, egNet := "moat-"+s.name+"-int", "moat-"+s.name+"-egress"
	gateName, workName, netName := "moat-"+s.name+"-gate", "moat-"+s.name+"-work", "moat-"+s.name+"-net"

	var subnet netip.Prefix
	var gateIP netip.Addr
	hooksLog := func() string {
		b, _ := os.ReadFile(filepath.Join(s.ws, "hooks.log"))
		return string(b)
	}
	t.Run("hooks ran once for the first start", func(t *testing.T) {
		s.must(t, "true")
		if got, want := hooksLog(), "created-as-"+strings.TrimSpace(s.must(t, "id", "-u"))+"-with-placeholder\nup\n"; got != want {
			t.Errorf("hooks.log after two sessions:\n%s\nwant on_create then on_up, once:\n%s", got, want)
		}
	})

	t.Run("topology", func(t *testing.T) {
		n, err := s.dc.NetworkInspect(ctx, intNet, networkInspect)
		if err != nil {
			t.Fatal(err)
		}
		if !n.Internal || n.EnableIPv6 {
			t.Errorf("internal network: Internal=%v EnableIPv6=%v; want true, false", n.Internal, n.EnableIPv6)
		}
		if len(n.IPAM.Config) != 1 {
			t.Fatalf("internal network's IPAM: %+v", n.IPAM.Config)
		}
		subnet = netip.MustParsePrefix(n.IPAM.Config[0].Subnet)
		// Docker assigns the lower half only; the upper is the gate's
		// names range.
		if got, want := n.IPAM.Config[0].IPRange, netip.PrefixFrom(subnet.Addr(), subnet.Bits()+1).String(); got != want {
			t.Errorf("internal network's IPRange = %q, want %s", got, want)
		}
		g, err := s.dc.ContainerInspect(ctx, gateName)
		if err != nil {
			t.Fatal(err)
		}
		if got := keys(g.NetworkSettings.Networks); !slices.Equal(got, []string{egNet, intNet}) {
			t.Errorf("gate's networks = %v, want %v", got, []string{egNet, intNet})
		}
		gateIP = netip.MustParseAddr(g.NetworkSettings.Networks[intNet].IPAddress)
		// The gate container gets CAP_NET_ADMIN for its names range; the
		// service that serves (the child of the container's first
		// process) has dropped it and every other capability.
		var kids []byte
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", g.State.Pid))
		for _, p := range tasks {
			b, _ := os.ReadFile(p)
			kids = append(kids, b...)
		}
		if f := strings.Fields(string(kids)); len(f) != 1 {
			t.Errorf("the gate's first process %d has children %q, want the jailed service alone", g.State.Pid, kids)
		} else {
			st, _ := os.ReadFile("/proc/" + f[0] + "/status")
			if !regexp.MustCompile(`(?m)^CapEff:\s+0+$`).Match(st) || !regexp.MustCompile(`(?m)^Uid:\s+65534\s`).Match(st) {
				t.Errorf("the gate's serving process keeps privileges:\n%s", grep(string(st), "Cap")+"\n"+grep(string(st), "Uid"))
			}
		}
		// The gate is moat-gate, the service's own binary: the moat
		// binary, without the service, is not in its image.
		if got := append(slices.Clone(g.Config.Entrypoint), g.Config.Cmd...); len(got) < 2 || got[0] != "/bin/moat-gate" || got[1] != "serve" {
			t.Errorf("gate runs %q, want /bin/moat-gate serve --config ...", got)
		}
		w, err := s.dc.ContainerInspect(ctx, workName)
		if err != nil {
			t.Fatal(err)
		}
		// The workload is in its network holder's namespace, which is on
		// the internal network only and runs nothing but moat-docker hold,
		// on runc, with no capability.
		h, err := s.dc.ContainerInspect(ctx, netName)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := string(w.HostConfig.NetworkMode), "container:"+netName; got != want && got != "container:"+h.ID {
			t.Errorf("workload's network mode = %q, want %s", got, want)
		}
		if got := keys(h.NetworkSettings.Networks); !slices.Equal(got, []string{intNet}) {
			t.Errorf("holder's networks = %v, want only %s", got, intNet)
		}
		if h.HostConfig.Runtime != "runc" || h.HostConfig.Privileged || len(h.HostConfig.CapAdd) > 0 || !slices.Contains(h.HostConfig.CapDrop, "ALL") {
			t.Errorf("holder: runtime %q, privileged=%v cap_add=%v cap_drop=%v; want runc, none added, all dropped", h.HostConfig.Runtime, h.HostConfig.Privileged, h.HostConfig.CapAdd, h.HostConfig.CapDrop)
		}
		if got := append(slices.Clone(h.Config.Entrypoint), h.Config.Cmd...); !slices.Equal(got, []string{"/bin/moat-docker", "hold"}) {
			t.Errorf("holder runs %q, want /bin/moat-docker hold", got)
		}
		if got, want := w.HostConfig.Runtime, workloadRuntime(t); got != want {
			t.Errorf("workload's runtime = %q, want %q", got, want)
		}
		if w.HostConfig.Privileged || len(w.HostConfig.CapAdd) > 0 || !slices.ContainsFunc(w.HostConfig.CapDrop, func(c string) bool { return strings.TrimPrefix(c, "CAP_") == "NET_RAW" }) {
			t.Errorf("workload's privileges: privileged=%v cap_add=%v cap_drop=%v; want none added and NET_RAW dropped", w.HostConfig.Privileged, w.HostConfig.CapAdd, w.HostConfig.CapDrop)
		}
		// The record pins the image by digest.
		img, err := s.dc.ImageInspect(ctx, w.Config.Image)
		if err != nil || !strings.HasPrefix(w.Config.Image, "sha256:") || img.ID != w.Config.Image {
			t.Errorf("workload's image is %q (%v), want the digest it resolved to", w.Config.Image, err)
		}
		// No default route, seen from the host and from inside: routes
		// to the subnet and to the reverse forwards' address only (under
		// runsc, gVisor took the namespace's addresses, and their routes
		// went with them, so the host's view may have fewer).
		checkRoutes(t, w.State.Pid, subnet)
		out := s.must(t, "sh", "-c", "ip route; ip -6 route")
		if !strings.Contains(out, subnet.String()+" dev eth0") {
			t.Errorf("workload's ip route:\n%s\nwant a route to %s on eth0", out, subnet)
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			// 127.0.0.0/8: gVisor lists its loopback's route.
			if f := strings.Fields(l); len(f) == 0 || (f[0] != subnet.String() && f[0] != "10.88.0.1" && f[0] != "127.0.0.0/8") {
				t.Errorf("workload's ip route has %q; want only routes to %s and 10.88.0.1:\n%s", l, subnet, out)
			}
		}
	})

	t.Run("no nat or forwarding out of the internal network", func(t *testing.T) {
		out, err := exec.Command("iptables-save").Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "MASQUERADE") && strings.Contains(l, subnet.String()) {
				t.Errorf("the internal subnet is masqueraded: %s", l)
			}
		}
		// Docker's isolation drops what leaves the bridge; moat's INPUT
		// rules drop what the bridge brings the host.
		for _, want := range []string{"! -d " + subnet.String() + " -i ", "-j DROP"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("iptables-save lacks %q", want)
			}
		}
		if !regexp.MustCompile(`-A INPUT -i moat[0-9a-f]+ -m comment --comment "?moat-` + s.name + `"? -j DROP`).Match(out) {
			t.Errorf("no INPUT DROP for the internal bridge:\n%s", grep(string(out), "INPUT"))
		}
	})

	t.Run("every name is the gate's to answer", func(t *testing.T) {
		out := s.must(t, "cat", "/etc/resolv.conf")
		if ns := regexp.MustCompile(`(?m)^nameserver\s+(\S+)`).FindAllStringSubmatch(out, -1); len(ns) != 1 || ns[0][1] != gateIP.String() {
			t.Errorf("resolv.conf:\n%s\nwant one nameserver, %s", out, gateIP)
		}
		for _, name := range []string{"anything.invalid", "allowed.test", "moat-" + s.name + "-gate"} {
			out, _, code := s.run(t, time.Minute, "nslookup", name)
			if code != 0 || !strings.Contains(out, "Server:\t\t"+gateIP.String()) {
				t.Errorf("nslookup %s (exit %d):\n%s\nwant an answer from the gate %s", name, code, out, gateIP)
			}
		}
		// Docker's embedded resolver would answer the network's
		// container names; moat removed the rules that reach it.
		out, _, code := s.run(t, time.Minute, "nslookup", "moat-"+s.name+"-gate", "127.0.0.11")
		if code == 0 {
			t.Errorf("Docker's embedded resolver answers:\n%s", out)
		}
		for _, q := range up.questions() {
			if !served(q) {
				t.Errorf("the upstream resolver was asked %q; only allowed names may leave", q)
			}
		}
	})

	t.Run("direct egress is dead", func(t *testing.T) {
		// nc fails at connect(2) with ENETUNREACH: no route, so no packet
		// leaves for these addresses.
		for _, dst := range []string{"1.1.1.1 80", "1.1.1.1 443", "169.254.169.254 80", "2606:4700:4700::1111 443"} {
			_, errs, code := s.run(t, time.Minute, "sh", "-c", "nc -w 3 "+dst+" </dev/null")
			if code == 0 || !regexp.MustCompile(`unreachable|not supported|Cannot assign`).MatchString(errs) {
				t.Errorf("nc %s: exit %d, %q; want a local failure", dst, code, strings.TrimSpace(errs))
			}
		}
	})

	t.Run("an allowed host through the gate", func(t *testing.T) {
		out := s.must(t, "wget", "-q", "-O-", "http://plain.test/")
		if out != "hello from plain.test\n" {
			t.Errorf("plain.test through the gate: %q", out)
		}
		out, errs, code := s.run(t, time.Minute, "wget", "-S", "-O-", "http://denied.test/")
		if code == 0 || !strings.Contains(errs, "403") {
			t.Errorf("denied.test: exit %d, %s\n%s; want the gate's 403", code, errs, out)
		}
	})

	t.Run("another port by name through the gate's names range", func(t *testing.T) {
		// The name's address is one of the upper half of the subnet,
		// which Docker assigns nobody and the gate answers for.
		if !subnet.IsValid() {
			t.Skip("the topology subtest reads the subnet; run it too")
		}
		out := s.must(t, "nslookup", "banner.test")
		a := subnet.Addr().As4()
		a[3] = 128
		names := netip.PrefixFrom(netip.AddrFrom4(a), subnet.Bits()+1)
		var got netip.Addr
		if m := regexp.MustCompile(`(?s)Name:\s+banner\.test\s+Address(?:\s+\d+)?:\s+(\d+\.\d+\.\d+\.\d+)`).FindStringSubmatch(out); m != nil {
			got, _ = netip.ParseAddr(m[1])
		}
		if !names.Contains(got) {
			t.Errorf("nslookup banner.test:\n%s\nwant an address of %s", out, names)
		}
		out, errs, code := s.run(t, time.Minute, "sh", "-c", "echo ping | nc -w 3 banner.test 2222")
		if code != 0 || out != "banner from 2222\nping\n" {
			t.Errorf("banner.test:2222 (allowed): exit %d, %q, %s; want the banner and the echo", code, out, errs)
		}
		// The upstream serves 2223 too: a refusal is the gate's.
		out, _, _ = s.run(t, time.Minute, "sh", "-c", "echo ping | nc -w 3 banner.test 2223")
		if strings.Contains(out, "banner") {
			t.Errorf("banner.test:2223 (not allowed) answered %q", out)
		}
		waitAudit(t, s, func(r auditRecord) bool {
			return r.Name == "banner.test" && r.Proto == "tcp" && strings.HasSuffix(r.Dst, ":2223") &&
				r.Verdict == "deny" && r.RejectedBy == "policy"
		}, "banner.test:2223 denied with rejected_by policy")
	})

	t.Run("HTTPS through the gate's interception verifies with no flags", func(t *testing.T) {
		if _, _, code := s.run(t, time.Minute, "sh", "-c", "command -v curl"); code != 0 {
			t.Skip("the host has no curl to put in the workload image; apt-get install curl")
		}
		out, errs, code := s.run(t, time.Minute, "curl", "-sS", "https://allowed.test/")
		if code != 0 || out != "hello from allowed.test\n" {
			t.Errorf("curl https://allowed.test/: exit %d, %q, %s", code, out, errs)
		}
		// The leaf curl saw is the gate's, not the upstream's.
		_, errs, _ = s.run(t, time.Minute, "curl", "-sSv", "-o", "/dev/null", "https://allowed.test/")
		if !strings.Contains(errs, "issuer:") || strings.Contains(errs, "moat docker test CA") {
			t.Errorf("curl -v shows no interception by the gate:\n%s", grep(errs, "issuer"))
		}
		out, _, code = s.run(t, time.Minute, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "https://denied.test/")
		if out != "403" {
			t.Errorf("curl https://denied.test/: exit %d, status %q; want the gate's 403", code, out)
		}
	})

	t.Run("a file secret's placeholder becomes its value for the bound host only", func(t *testing.T) {
		if _, _, code := s.run(t, time.Minute, "sh", "-c", "command -v curl"); code != 0 {
			t.Skip("the host has no curl to put in the workload image; apt-get install curl")
		}
		ph := strings.TrimSpace(s.must(t, "sh", "-c", "echo $API_TOKEN"))
		if ph == "" || strings.Contains(ph, secret) {
			t.Fatalf("the session's API_TOKEN is %q; want a placeholder", ph)
		}
		out := s.must(t, "sh", "-c", `curl -sS -H "Authorization: Bearer $API_TOKEN" https://allowed.test/echo`)
		if got := up.auths(); len(got) != 1 || got[0] != "Bearer "+secret {
			t.Errorf("the bound host received Authorization %q, want the real value once", got)
		}
		// The upstream echoed the value; the gate scrubbed it back.
		if out != "Bearer "+ph+"\n" {
			t.Errorf("the workload read %q in the echo, want its placeholder", out)
		}
		// An unbound host gets the placeholder unchanged.
		s.must(t, "sh", "-c", `wget -q -O- --header "Authorization: Bearer $API_TOKEN" http://plain.test/echo`)
		if got := up.auths(); len(got) != 2 || got[1] != "Bearer "+ph {
			t.Errorf("the unbound host received %q, want the placeholder", got)
		}
		// Nowhere else: not in the gate's log nor in its audit.
		rc, err := s.dc.ContainerLogs(ctx, gateName, container.LogsOptions{ShowStdout: true, ShowStderr: true})
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		stdcopy.StdCopy(&logs, &logs, rc)
		rc.Close()
		audit, _ := os.ReadFile(filepath.Join(s.home, "state", "sandboxes", s.name, "gate", "state", "audit", "workload.jsonl"))
		if len(audit) == 0 || bytes.Contains(logs.Bytes(), []byte(secret)) || logs.Len() == 0 || bytes.Contains(audit, []byte(secret)) {
			t.Errorf("the value is in the gate's log or audit (log %d bytes, audit %d bytes)", logs.Len(), len(audit))
		}
	})

	t.Run("an env: secret reaches the gate over its control socket and nowhere else", func(t *testing.T) {
		if _, _, code := s.run(t, time.Minute, "sh", "-c", "command -v curl"); code != 0 {
			t.Skip("the host has no curl to put in the workload image; apt-get install curl")
		}
		ph := strings.TrimSpace(s.must(t, "sh", "-c", "echo $CANARY"))
		if !strings.HasPrefix(ph, "moat-") || strings.Contains(ph, canary) {
			t.Fatalf("the session's CANARY is %q; want a placeholder", ph)
		}
		// A session runs while every process on the host is searched:
		// moat (whose environment the value comes from) aside, none may
		// hold it in its environment or arguments.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, s.bin, "run", "--trust-project", "--", "sh", "-c",
			`curl -sS -H "Authorization: Bearer $CANARY" https://allowed.test/echo; sleep 2`)
		cmd.Dir, cmd.Env = s.ws, s.env
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		scans := 0
		var werr error
	scan:
		for {
			for _, hit := range procHolding(canary, cmd.Process.Pid) {
				t.Errorf("the value is in %s", hit)
			}
			scans++
			select {
			case werr = <-waited:
				break scan
			case <-time.After(20 * time.Millisecond):
			}
		}
		if werr != nil {
			t.Fatalf("moat run: %v", werr)
		}
		t.Logf("searched every process's environ and cmdline %d times during the session", scans)
		if got := up.auths(); len(got) == 0 || got[len(got)-1] != "Bearer "+canary {
			t.Errorf("the bound host received Authorization %q, want the env: value last", got)
		}
		if out.String() != "Bearer "+ph+"\n" {
			t.Errorf("the workload read %q in the echo, want its placeholder", out.String())
		}
		for _, hit := range procHolding(canary, -1) {
			t.Errorf("after the session, the value is in %s", hit)
		}
		for _, c := range []string{gateName, workName} {
			_, raw, err := s.dc.ContainerInspectWithRaw(ctx, c, true)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(raw, []byte(canary)) {
				t.Errorf("docker inspect %s shows the value", c)
			}
		}
		rc, err := s.dc.ContainerLogs(ctx, gateName, container.LogsOptions{ShowStdout: true, ShowStderr: true})
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		stdcopy.StdCopy(&logs, &logs, rc)
		rc.Close()
		if logs.Len() == 0 || bytes.Contains(logs.Bytes(), []byte(canary)) || !bytes.Contains(logs.Bytes(), []byte("pushed over the control socket")) {
			t.Errorf("the gate's log (%d bytes) holds the value, or no push:\n%s", logs.Len(), grep(logs.String(), "secret"))
		}
		// The state directory (audit, placeholders, records) and the
		// rest of MOAT_HOME.
		filepath.Walk(s.home, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(canary)) {
					t.Errorf("%s holds the value", p)
				}
			}
			return nil
		})
		// The socket is root's alone.
		sock := filepath.Join(s.home, "state", "sandboxes", s.name, "gate", "control", "control.sock")
		if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
			t.Errorf("control socket %s: %v %v; want a socket, mode 0600", sock, fi, err)
		}
	})

	t.Run("a secret that cannot be read stops the session", func(t *testing.T) {
		// Unset: moat says which variable to export.
		s0 := *s
		s0.env = slices.DeleteFunc(slices.Clone(s.env), func(kv string) bool { return strings.HasPrefix(kv, "MOAT_DOCKER_CANARY=") })
		_, errs, code := s0.run(t, time.Minute, "true")
		if code == 0 || !strings.Contains(errs, "MOAT_DOCKER_CANARY is not set") {
			t.Errorf("moat run without the variable: exit %d, %s; want a failure naming it", code, errs)
		}
		// A value the gate refuses: the push fails, and so does the
		// session; the gate keeps the value it had.
		s0.env = append(s0.env, "MOAT_DOCKER_CANARY=short")
		_, errs, code = s0.run(t, time.Minute, "true")
		if code == 0 || !strings.Contains(errs, "CANARY") || !strings.Contains(errs, "gate") {
			t.Errorf("moat run with a value the gate refuses: exit %d, %s; want a failure naming the secret", code, errs)
		}
		s.must(t, "sh", "-c", `curl -sS -o /dev/null -H "Authorization: Bearer $CANARY" https://allowed.test/echo`)
		if got := up.auths(); len(got) == 0 || got[len(got)-1] != "Bearer "+canary {
			t.Errorf("after a refused push the bound host received %q, want the earlier value", got)
		}
	})

	t.Run("a denial is audited with the step that refused it", func(t *testing.T) {
		logs, _ := filepath.Glob(filepath.Join(s.home, "*", "sandboxes", s.name, "gate", "state", "audit", "workload.jsonl"))
		logs2, _ := filepath.Glob(filepath.Join(s.home, "sandboxes", s.name, "gate", "state", "audit", "workload.jsonl"))
		logs = append(logs, logs2...)
		if len(logs) != 1 {
			t.Fatalf("the gate's audit log for the workload: found %v under %s", logs, s.home)
		}
		// Written as the requests end; a few seconds at most.
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, err := os.ReadFile(logs[0])
			if err != nil {
				t.Fatal(err)
			}
			var found bool
			for _, l := range strings.Split(string(b), "\n") {
				var rec struct {
					Proto      string `json:"proto"`
					Name       string `json:"name"`
					Verdict    string `json:"verdict"`
					RejectedBy string `json:"rejected_by"`
				}
				// The connection's record, not the DNS answer's.
				if json.Unmarshal([]byte(l), &rec) == nil && rec.Name == "denied.test" && rec.Proto != "dns" &&
					rec.Verdict == "deny" && rec.RejectedBy == "policy" {
					found = true
				}
			}
			if found {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no record for denied.test with rejected_by policy in %s:\n%s", logs[0], b)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("the gate's CA, as moat init installs it", func(t *testing.T) {
		// The CA's first line of base64 in the system bundle.
		out := s.must(t, "sh", "-c", "env; grep -qF \"$(sed -n 2p /.moat/ca.pem)\" /etc/ssl/certs/ca-certificates.crt && echo ca-in-bundle")
		if !strings.Contains(out, "ca-in-bundle") {
			t.Errorf("the gate's CA is not in /etc/ssl/certs/ca-certificates.crt")
		}
		for _, want := range []string{"NODE_EXTRA_CA_CERTS=/.moat/ca.pem", "REQUESTS_CA_BUNDLE=", "PIP_CERT="} {
			if !strings.Contains(out, want) {
				t.Errorf("session environment lacks %s:\n%s", want, out)
			}
		}
		if strings.Contains(out, "SSL_CERT_FILE") {
			t.Errorf("SSL_CERT_FILE is set; it would replace every other root")
		}
	})

	t.Run("exit codes", func(t *testing.T) {
		if _, _, code := s.run(t, time.Minute, "sh", "-c", "exit 7"); code != 7 {
			t.Errorf("exit 7 gave %d", code)
		}
		start := time.Now()
		out := s.must(t, "sh", "-c", "sleep 300 & echo done")
		if d := time.Since(start); out != "done\n" || d > 10*time.Second {
			t.Errorf("a background child held the session: %q after %s", out, d)
		}
	})

	t.Run("killing a session's group leaves no zombie", func(t *testing.T) {
		// The session's shell leads its own group (setsid); killing the
		// group orphans nothing that PID 1 does not reap.
		if _, errs, code := s.run(t, time.Minute, "sh", "-c", "sleep 300 & sleep 300 & kill -9 -$$"); code != 128+9 {
			t.Fatalf("the session killed its own group and exited %d, want %d: %s", code, 128+9, errs)
		}
		time.Sleep(time.Second)
		out := s.must(t, "sh", "-c", "for f in /proc/[0-9]*/stat; do read -r l < $f && echo \"$l\"; done")
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[2] == "Z" {
				t.Errorf("zombie: %s", l)
			}
		}
	})

	t.Run("with the gate down nothing gets out", func(t *testing.T) {
		if err := s.dc.ContainerKill(ctx, gateName, "KILL"); err != nil {
			t.Fatal(err)
		}
		// Straight into the workload: a moat run would start the gate
		// first.
		for _, argv := range [][]string{
			{"wget", "-q", "-T", "3", "-O-", "http://plain.test/"},
			{"wget", "-q", "-T", "3", "-O-", "http://" + hostEnd + "/"},
			{"nslookup", "plain.test"},
		} {
			out, code := dockerExec(t, s, workName, argv)
			if code == 0 {
				t.Errorf("%v with the gate down: exit 0, %q", argv, out)
			}
		}
	})

	t.Run("stopped containers start again as they were, isolated again", func(t *testing.T) {
		s.must(t, "sh", "-c", "echo kept > /var/marker")
		for _, c := range []string{workName, netName, gateName} {
			if err := s.dc.ContainerKill(ctx, c, "KILL"); err != nil {
				t.Fatal(err)
			}
		}
		before := strings.Count(hooksLog(), "up\n")
		if out := s.must(t, "cat", "/var/marker"); out != "kept\n" {
			t.Errorf("after a restart /var/marker holds %q, want the workload's own file", out)
		}
		// A new start of the workload: on_up again, on_create not.
		if got := hooksLog(); strings.Count(got, "up\n") != before+1 || strings.Count(got, "created") != 1 {
			t.Errorf("hooks.log after a restart:\n%s\nwant one more on_up, no other on_create", got)
		}
		w, err := s.dc.ContainerInspect(ctx, workName)
		if err != nil {
			t.Fatal(err)
		}
		checkRoutes(t, w.State.Pid, subnet)
		if out := s.must(t, "wget", "-q", "-O-", "http://plain.test/"); out != "hello from plain.test\n" {
			t.Errorf("plain.test through the restarted gate: %q", out)
		}
	})

	t.Run("a workload Docker restarted has no way out, and works at the next session", func(t *testing.T) {
		t0 := 5
		if err := s.dc.ContainerRestart(ctx, workName, container.StopOptions{Timeout: &t0}); err != nil {
			t.Fatal(err)
		}
		w, err := s.dc.ContainerInspect(ctx, workName)
		if err != nil {
			t.Fatal(err)
		}
		// At once, before any session: the holder's namespace, which
		// Docker does not touch when it restarts the workload.
		checkRoutes(t, w.State.Pid, subnet)
		// The agent may still be starting; the session waits for it
		// (under runsc, the session starts the workload again: gVisor
		// took its addresses when it stopped).
		out := s.must(t, "ip", "route")
		if strings.Contains(out, "default") || !strings.Contains(out, subnet.String()) {
			t.Errorf("after docker restart, the workload's routes:\n%s\nwant %s and no default", out, subnet)
		}
		if out := s.must(t, "wget", "-q", "-O-", "http://plain.test/"); out != "hello from plain.test\n" {
			t.Errorf("plain.test after docker restart: %q", out)
		}
	})

	t.Run("a holder Docker restarted: the workload starts again in its new namespace, isolated", func(t *testing.T) {
		t0 := 5
		if err := s.dc.ContainerRestart(ctx, netName, container.StopOptions{Timeout: &t0}); err != nil {
			t.Fatal(err)
		}
		// Docker's routes are back in the new namespace until a session
		// isolates it; the workload is still in the old one.
		out := s.must(t, "ip", "route")
		if strings.Contains(out, "default") || !strings.Contains(out, subnet.String()) {
			t.Errorf("after docker restart of the holder, the workload's routes:\n%s\nwant %s and no default", out, subnet)
		}
		h, err := s.dc.ContainerInspect(ctx, netName)
		if err != nil {
			t.Fatal(err)
		}
		checkRoutes(t, h.State.Pid, subnet)
		if out := s.must(t, "wget", "-q", "-O-", "http://plain.test/"); out != "hello from plain.test\n" {
			t.Errorf("plain.test after docker restart of the holder: %q", out)
		}
		// The guest's hostname, which the workload takes from the holder.
		if got := strings.TrimSpace(s.must(t, "hostname")); got != s.name {
			t.Errorf("the workload's hostname is %q, want the sandbox's name %q", got, s.name)
		}
		// Killed alone: the next session starts it, and the workload in
		// it, again.
		if err := s.dc.ContainerKill(ctx, netName, "KILL"); err != nil {
			t.Fatal(err)
		}
		if out := s.must(t, "wget", "-q", "-O-", "http://plain.test/"); out != "hello from plain.test\n" {
			t.Errorf("plain.test after the holder was killed: %q", out)
		}
	})

	t.Run("moat down stops the containers and keeps them", func(t *testing.T) {
		cmd := exec.Command(s.bin, "down", s.name)
		cmd.Dir, cmd.Env = s.ws, s.env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("moat down: %v\n%s", err, out)
		}
		for _, c := range []string{gateName, netName, workName} {
			if st, err := s.dc.ContainerInspect(ctx, c); err != nil || st.State.Running {
				t.Errorf("after moat down, %s: %v, running=%v; want it kept, stopped", c, err, err == nil && st.State.Running)
			}
		}
		if out := s.must(t, "cat", "/var/marker"); out != "kept\n" {
			t.Errorf("after moat down and a run, /var/marker holds %q", out)
		}
	})

	t.Run("moat up refuses a Docker sandbox", func(t *testing.T) {
		cmd := exec.Command(s.bin, "up", s.name)
		cmd.Dir, cmd.Env = s.ws, s.env
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "moat run") {
			t.Errorf("moat up: %v\n%s\nwant exit 2 and a hint to use moat run", err, out)
		}
	})

	t.Run("destroy removes containers, networks and host rules", func(t *testing.T) {
		s.destroy(t)
		for _, n := range []string{intNet, egNet} {
			if _, err := s.dc.NetworkInspect(ctx, n, networkInspect); err == nil {
				t.Errorf("network %s is left", n)
			}
		}
		for _, c := range []string{gateName, workName} {
			if _, err := s.dc.ContainerInspect(ctx, c); err == nil {
				t.Errorf("container %s is left", c)
			}
		}
		out, _ := exec.Command("iptables-save").Output()
		if strings.Contains(string(out), "moat-"+s.name) {
			t.Errorf("host rules are left:\n%s", grep(string(out), "moat-"+s.name))
		}
	})
}

// procHolding lists the processes other than skip whose environment or
// arguments hold s.
// checkRoutes fails the test unless pid's network namespace has no
// route but to the subnet and the reverse forwards' link: no default.
func checkRoutes(t *testing.T, pid int, subnet netip.Prefix) {
	t.Helper()
	allowed := []netip.Prefix{subnet, netip.MustParsePrefix("10.88.0.1/32"), netip.MustParsePrefix("10.88.0.2/32")}
	got, err := engine.Routes(pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range got {
		if !slices.Contains(allowed, p) {
			t.Errorf("the workload's namespace (host's view) has a route to %s; want only %v (all: %v)", p, allowed, got)
		}
	}
}

func procHolding(s string, skip int) []string {
	var out []string
	paths, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, env := range paths {
		pid := filepath.Base(filepath.Dir(env))
		if pid == fmt.Sprint(skip) {
			continue
		}
		for _, f := range []string{env, filepath.Join(filepath.Dir(env), "cmdline")} {
			if b, err := os.ReadFile(f); err == nil && bytes.Contains(b, []byte(s)) {
				comm, _ := os.ReadFile(filepath.Join(filepath.Dir(env), "comm"))
				out = append(out, f+" ("+strings.TrimSpace(string(comm))+")")
			}
		}
	}
	return out
}

// auditRecord is the part of an audit record these tests read.
type auditRecord struct {
	Proto      string `json:"proto"`
	Name       string `json:"name"`
	Dst        string `json:"dst"`
	Verdict    string `json:"verdict"`
	RejectedBy string `json:"rejected_by"`
}

// waitAudit waits up to 10 s for a record of the workload's audit log
// that match accepts (records are written as connections end).
func waitAudit(t *testing.T, s *sandbox, match func(auditRecord) bool, what string) {
	t.Helper()
	path := filepath.Join(s.home, "state", "sandboxes", s.name, "gate", "state", "audit", "workload.jsonl")
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		for _, l := range strings.Split(string(b), "\n") {
			var r auditRecord
			if json.Unmarshal([]byte(l), &r) == nil && match(r) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit record for %s in %s:\n%s", what, path, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// dockerExec runs argv in a container through the engine, bounded, and
// returns its output and exit code.
func dockerExec(t *testing.T, s *sandbox, name string, argv []string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ex, err := s.dc.ContainerExecCreate(ctx, name, container.ExecOptions{Cmd: argv, AttachStdout: true, AttachStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	hj, err := s.dc.ContainerExecAttach(ctx, ex.ID, container.ExecAttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	stdcopy.StdCopy(&out, &out, hj.Reader)
	hj.Close()
	in, err := s.dc.ContainerExecInspect(ctx, ex.ID)
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), in.ExitCode
}
