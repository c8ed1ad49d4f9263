package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/kubert"
)

// The CLI against the cluster: moat run --runtime kubernetes, exec,
// network audit and denials, list and destroy, through the moat binary
// exactly as a user types them (docs/kubernetes.md, "The CLI").

var (
	moatOnce sync.Once
	moatBin  string
	moatErr  error
)

// moatBinary is $MOAT_BIN (its moat-kube beside it), else moat and
// moat-kube built once into a temporary directory.
func moatBinary(t *testing.T) string {
	t.Helper()
	moatOnce.Do(func() {
		if moatBin = os.Getenv("MOAT_BIN"); moatBin != "" {
			if _, err := os.Stat(filepath.Join(filepath.Dir(moatBin), "moat-kube")); err != nil {
				moatErr = fmt.Errorf("MOAT_BIN=%s but no moat-kube beside it: %v; build all of ./cmd/... into its directory", moatBin, err)
			}
			return
		}
		dir, err := os.MkdirTemp("", "moat-cluster-cli-")
		if err != nil {
			moatErr = err
			return
		}
		out, err := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "moat.dev/moat/cmd/moat", "moat.dev/moat/cmd/moat-kube").CombinedOutput()
		if err != nil {
			moatErr = fmt.Errorf("building moat and moat-kube: %v\n%s", err, out)
		}
		moatBin = filepath.Join(dir, "moat")
	})
	if moatErr != nil {
		t.Fatal(moatErr)
	}
	return moatBin
}

// cli runs moat commands for one test: its own MOAT_HOME and workspace,
// the cluster's admin kubeconfig as KUBECONFIG.
type cli struct {
	bin, home, ws, kubeconfig string
}

func newCLI(t *testing.T) *cli {
	kc := os.Getenv("MOAT_CLUSTER_KUBECONFIG")
	if kc == "" {
		kc = "/var/lib/moat-cluster/pki/admin.kubeconfig"
	}
	return &cli{bin: moatBinary(t), home: t.TempDir(), ws: t.TempDir(), kubeconfig: kc}
}

type result struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// command is moat with args as the test's user runs it: in the
// workspace, with the test's MOAT_HOME and the cluster's kubeconfig.
func (c *cli) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Dir = c.ws
	cmd.Env = append(os.Environ(), "MOAT_HOME="+c.home, "KUBECONFIG="+c.kubeconfig)
	return cmd
}

// exitCode is moat's exit code from cmd.Wait's err; any other failure
// (moat could not start, or was killed) ends the test.
func exitCode(t *testing.T, err error, args []string) int {
	t.Helper()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	} else if err != nil {
		t.Fatalf("moat %q: %v", args, err)
	}
	return 0
}

func (c *cli) run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := c.command(ctx, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	err := cmd.Run()
	return result{stdout: out.String(), stderr: errb.String(), took: time.Since(t0), code: exitCode(t, err, args)}
}

// runPTY runs moat on a terminal of rows x cols, and returns what it
// printed there and its exit code.
func (c *cli) runPTY(t *testing.T, rows, cols uint16, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := c.command(ctx, args...)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&out, f); close(done) }()
	err = cmd.Wait()
	f.Close()
	<-done
	return out.String(), exitCode(t, err, args)
}

// followAudit runs moat network audit NAME -f until it prints a line
// with want, then interrupts it, which must end it at once.
func (c *cli) followAudit(t *testing.T, name, want string) {
	t.Helper()
	cmd := c.command(context.Background(), "network", "audit", name, "-f")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	seen := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		found := false
		for sc.Scan() {
			if !found && strings.Contains(sc.Text(), want) {
				found = true
				seen <- true
			}
		}
		if !found {
			seen <- false
		}
	}()
	select {
	case ok := <-seen:
		if !ok {
			t.Errorf("moat network audit %s -f ended without a line with %q", name, want)
		}
	case <-time.After(time.Minute):
		t.Errorf("moat network audit %s -f: no line with %q in a minute", name, want)
	}
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("moat network audit -f, interrupted: %v; want exit 0", err)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Errorf("moat network audit -f still running 20 s after SIGINT")
	}
}

// kubeRecord is the claim moat recorded for sandbox name.
func (c *cli) kubeRecord(t *testing.T, name string) kubert.Record {
	t.Helper()
	r, err := kubert.LoadRecord(filepath.Join(c.home, "state", "sandboxes", name))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var cliKindOnce sync.Once
var cliKindErr error

// cliKind is template "cli": alpha's policy, with the alpha Secret bound
// by the template (the CLI's claims name none), and a warm pool of one.
func cliKind(t *testing.T) *env {
	e := kinds(t)
	cliKindOnce.Do(func() {
		cliKindErr = e.makeKind(context.Background(), sandboxKind{name: "cli", policy: policyAlpha, secret: "alpha-token"}, 1)
	})
	if cliKindErr != nil {
		t.Fatal(cliKindErr)
	}
	return e
}

// Bad flags are refused before anything is made, naming the flag.
func TestCLIRefuses(t *testing.T) {
	e := cliKind(t)
	c := newCLI(t)
	for _, tc := range []struct {
		args []string
		code int
		say  string
	}{
		{[]string{"--context", "no-such-context", "--template", "cli"}, 2, "--context"},
		{[]string{}, 2, "--template"},
		{[]string{"--template", "no-such-template"}, 3, "--template no-such-template"},
	} {
		args := append([]string{"run", "--runtime", "kubernetes", "--namespace", e.sbNS, "--name", "refused"}, tc.args...)
		r := c.run(t, "", append(args, "--", "/client", "say", "x", "", "0")...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.say) {
			t.Errorf("moat %q: exit %d, stderr %q; want exit %d and it to name %q", args, r.code, r.stderr, tc.code, tc.say)
		}
		t.Logf("moat %q: exit %d: %s", tc.args, r.code, strings.TrimSpace(r.stderr))
		if _, err := os.Stat(filepath.Join(c.home, "state", "sandboxes", "refused")); err == nil {
			t.Errorf("moat %q left a sandbox record", args)
		}
	}
	r := c.run(t, "", "run", "--template", "cli", "--", "/client", "say", "x", "", "0")
	if r.code != 2 || !strings.Contains(r.stderr, "--runtime kubernetes") {
		t.Errorf("--template without the kubernetes runtime: exit %d, %q; want 2, naming --runtime kubernetes", r.code, r.stderr)
	}
}

// A sandbox claimed from a warm pool runs commands with their own exit
// codes, stdout and stderr apart and stdin passed; its traffic goes
// through the gate with the secret swapped in; a denied host gets the
// gate's 403, and moat network denials and audit show it with the
// claim; moat list shows it; destroy deletes the claim.
func TestCLIRun(t *testing.T) {
	e := cliKind(t)
	if err := e.waitPool(context.Background(), "cli"); err != nil {
		t.Fatal(err)
	}
	c := newCLI(t)
	r := c.run(t, "", "run", "--runtime", "kubernetes", "--namespace", e.sbNS, "--template", "cli", "--gate-namespace", e.gateNS,
		"--name", "c1", "--", "/client", "say", "to-stdout", "to-stderr", "0")
	if r.code != 0 || r.stdout != "to-stdout\n" || !strings.Contains(r.stderr, "to-stderr") || strings.Contains(r.stdout, "to-stderr") {
		t.Fatalf("moat run: exit %d, stdout %q, stderr %q; want 0, to-stdout alone on stdout, to-stderr on stderr", r.code, r.stdout, r.stderr)
	}
	t.Logf("claim to first output through the CLI: %s", r.took.Round(time.Millisecond))
	kr := c.kubeRecord(t, "c1")
	ctx := context.Background()
	cl, err := e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Get(ctx, kr.Claim, metav1.GetOptions{})
	if err != nil || string(cl.UID) != kr.ClaimUID || cl.Spec.WarmPoolRef.Name != "cli" {
		t.Fatalf("the recorded claim %+v: %v %+v", kr, err, cl)
	}
	// No --context: the current one is recorded as it was, so that a
	// later change of the kubeconfig's current context cannot send this
	// sandbox's commands to another cluster.
	if kc, err := clientcmd.LoadFromFile(c.kubeconfig); err != nil || kc.CurrentContext == "" || kr.Context != kc.CurrentContext {
		t.Errorf("recorded context %q; want the kubeconfig's current one (%v)", kr.Context, err)
	}
	t.Cleanup(func() {
		e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Delete(context.Background(), kr.Claim, metav1.DeleteOptions{})
	})

	if r := c.run(t, "", "exec", "c1", "--", "/client", "say", "", "", "7"); r.code != 7 {
		t.Errorf("moat exec of a command exiting 7: exit %d (stderr %q)", r.code, r.stderr)
	}
	// A second run by name reuses the claim, as on gVisor.
	if r := c.run(t, "line one\nline two\n", "run", "--name", "c1", "--", "/client", "cat"); r.code != 0 || r.stdout != "line one\nline two\n" {
		t.Errorf("moat run cat with stdin: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if kr2 := c.kubeRecord(t, "c1"); kr2.ClaimUID != kr.ClaimUID {
		t.Errorf("the second run made claim %s; want the first, %s", kr2.Claim, kr.Claim)
	}
	if r := c.run(t, "", "exec", "c1", "--", "/no/such/binary"); r.code == 0 {
		t.Errorf("moat exec of a missing binary: exit 0")
	} else {
		t.Logf("moat exec of a missing binary: exit %d: %s", r.code, strings.TrimSpace(r.stderr))
	}

	if r := c.run(t, "", "exec", "c1", "--", "/client", "kill", "9"); r.code != 128+9 {
		t.Errorf("moat exec of a command killed by SIGKILL: exit %d (stderr %q); want 137", r.code, r.stderr)
	}
	if r := c.run(t, "", "exec", "c1", "--", "/client", "tty"); !strings.Contains(r.stdout, "stdin_tty=false stdout_tty=false") {
		t.Errorf("moat exec without a terminal: %q %q; want no terminal in the pod", r.stdout, r.stderr)
	}
	if out, code := c.runPTY(t, 37, 101, "exec", "c1", "--", "/client", "tty"); code != 0 || !strings.Contains(out, "stdin_tty=true stdout_tty=true size=101x37") {
		t.Errorf("moat exec on a 101x37 terminal: exit %d, %q; want a terminal of that size in the pod", code, out)
	}

	r = c.run(t, "", "exec", "c1", "--", "/client", "get", "https://alpha.moat.test/cli")
	if !strings.Contains(r.stdout, "status=200") || strings.Contains(r.stdout, e.token) {
		t.Errorf("allowed host: %q (stderr %q); want status 200 and not the real value", r.stdout, r.stderr)
	}
	if !e.up.saw("alpha.moat.test", "/cli", "Bearer "+e.token) {
		t.Errorf("the upstream never got /cli with the real value: %+v", e.up.seenBy("alpha.moat.test"))
	}
	r = c.run(t, "", "exec", "c1", "--", "/client", "get", "https://beta.moat.test/cli-denied")
	if !strings.Contains(r.stdout, "status=403") {
		t.Errorf("denied host: %q (stderr %q); want the gate's 403", r.stdout, r.stderr)
	}
	if e.up.saw("beta.moat.test", "/cli-denied", "") {
		t.Errorf("the denied request reached the upstream")
	}

	// The gate's audit follower polls its file; its log is read through
	// the API. Bounded wait for the denial to show.
	var den result
	if err := poll(ctx, time.Minute, func() (bool, string) {
		den = c.run(t, "", "network", "denials", "c1")
		return den.code == 0 && strings.Contains(den.stdout, "beta.moat.test"), fmt.Sprintf("moat network denials c1: exit %d %q %q", den.code, den.stdout, den.stderr)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("moat network denials c1:\n%s", den.stdout)
	r = c.run(t, "", "network", "audit", "c1", "--json")
	if r.code != 0 {
		t.Fatalf("moat network audit --json: exit %d %q", r.code, r.stderr)
	}
	var deny, allow bool
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var rec audit.Record
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("moat network audit --json line %q: %v", l, err)
		}
		if rec.ClaimUID != kr.ClaimUID || rec.Claim != kr.Claim {
			t.Errorf("moat network audit c1 shows a record of claim %q (%s), not c1's %s", rec.Claim, rec.ClaimUID, kr.Claim)
		}
		deny = deny || (rec.Verdict == audit.Deny && strings.Contains(rec.Name, "beta.moat.test") && rec.Sandbox == kr.Sandbox)
		allow = allow || (rec.Verdict == audit.Allow && strings.Contains(rec.Name, "alpha.moat.test"))
	}
	if !deny || !allow {
		t.Errorf("moat network audit c1 --json: denial of beta.moat.test naming the sandbox %v, allow of alpha.moat.test %v:\n%s", deny, allow, r.stdout)
	}
	r = c.run(t, "", "network", "audit", "c1")
	t.Logf("moat network audit c1:\n%s", r.stdout)
	if !strings.Contains(r.stdout, "deny") || !strings.Contains(r.stdout, "beta.moat.test") {
		t.Errorf("moat network audit c1: %q %q", r.stdout, r.stderr)
	}

	c.followAudit(t, "c1", "beta.moat.test")
	r = c.run(t, "", "status", "c1")
	t.Logf("moat status c1:\n%s", r.stdout)
	if r.code != 0 || !strings.Contains(r.stdout, "claimed") || !strings.Contains(r.stdout, kr.Claim) {
		t.Errorf("moat status c1: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = c.run(t, "", "list")
	t.Logf("moat list:\n%s", r.stdout)
	if !strings.Contains(r.stdout, "c1") || !strings.Contains(r.stdout, "claimed") || !strings.Contains(r.stdout, "kubernetes") {
		t.Errorf("moat list: %q; want c1, claimed, kubernetes", r.stdout)
	}
	if r := c.run(t, "", "up", "c1"); r.code != 2 {
		t.Errorf("moat up of a Kubernetes sandbox: exit %d %q; want 2 (it has no daemon)", r.code, r.stderr)
	}

	r = c.run(t, "", "destroy", "c1", "--yes")
	if r.code != 0 {
		t.Fatalf("moat destroy: exit %d %q", r.code, r.stderr)
	}
	if _, err := e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Get(ctx, kr.Claim, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after moat destroy, claim %s: %v; want it gone", kr.Claim, err)
	}
	if r := c.run(t, "", "exec", "c1", "--", "/client", "say", "x", "", "0"); r.code != 3 {
		t.Errorf("moat exec after destroy: exit %d %q; want 3", r.code, r.stderr)
	}
	t.Logf("moat destroy: %s", strings.TrimSpace(r.stderr))
}

// A claim whose pod never gets Ready (its image is not on the node) is
// waited for until the user interrupts moat, as Ctrl-C on a terminal
// does (SIGINT to moat's process group, moat-kube included): the claim
// is deleted and nothing is recorded.
func TestCLIInterruptedClaim(t *testing.T) {
	e := setUp(t)
	ctx := context.Background()
	tpl := &extv1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "never-ready"},
		Spec: extv1.SandboxTemplateSpec{SandboxBlueprint: sandboxv1.SandboxBlueprint{PodTemplate: sandboxv1.PodTemplate{
			Spec: corev1.PodSpec{
				RuntimeClassName:             ptr("gvisor"),
				AutomountServiceAccountToken: ptr(false),
				Containers:                   []corev1.Container{{Name: "agent", Image: "moat.local/no-such-image:none", ImagePullPolicy: corev1.PullNever}},
			},
		}}},
	}
	if _, err := e.ext.ExtensionsV1beta1().SandboxTemplates(e.sbNS).Create(ctx, tpl, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := e.ext.ExtensionsV1beta1().SandboxWarmPools(e.sbNS).Create(ctx, &extv1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: "never-ready"},
		Spec:       extv1.SandboxWarmPoolSpec{Replicas: ptr(int32(1)), TemplateRef: extv1.SandboxTemplateRef{Name: "never-ready"}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		e.ext.ExtensionsV1beta1().SandboxWarmPools(e.sbNS).Delete(ctx, "never-ready", metav1.DeleteOptions{})
		e.ext.ExtensionsV1beta1().SandboxTemplates(e.sbNS).Delete(ctx, "never-ready", metav1.DeleteOptions{})
	})
	c := newCLI(t)
	cmd := c.command(context.Background(), "run", "--runtime", "kubernetes", "--namespace", e.sbNS, "--template", "never-ready", "--name", "stuck", "--", "/client", "say", "x", "", "0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var claim string
	if err := poll(ctx, time.Minute, func() (bool, string) {
		l, err := e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).List(ctx, metav1.ListOptions{LabelSelector: "moat.dev/sandbox=stuck"})
		if err != nil || len(l.Items) == 0 {
			return false, fmt.Sprintf("no claim of moat's yet (%v); moat says %q", err, errb.String())
		}
		claim = l.Items[0].Name
		return true, ""
	}); err != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		t.Fatal(err)
	}
	time.Sleep(time.Second) // well into the wait for a Ready pod
	syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("moat run exited 0 after an interrupted claim")
		}
	case <-time.After(time.Minute):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("moat run still running a minute after SIGINT; stderr %q", errb.String())
	}
	t.Logf("moat run, interrupted: %s", strings.TrimSpace(errb.String()))
	if _, err := e.ext.ExtensionsV1beta1().SandboxClaims(e.sbNS).Get(ctx, claim, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("claim %s after the interrupted run: %v; want it deleted", claim, err)
	}
	if _, err := os.Stat(filepath.Join(c.home, "state", "sandboxes", "stuck")); err == nil {
		t.Errorf("the interrupted run left a sandbox record")
	}
}

// --secret binds a Secret to the claim (the gate's moat.dev/secret on
// it): a claim of template alpha, which binds none, gets alpha's value
// swapped in with it, and without it its requests to the secret's host
// are refused (the value is pending).
func TestCLISecretFlag(t *testing.T) {
	e := kinds(t)
	ctx := context.Background()
	c := newCLI(t)
	for _, tc := range []struct {
		name   string
		secret []string
		want   string
	}{
		{"with-secret", []string{"--secret", "alpha-token"}, "status=200"},
		{"without", nil, "status=403"},
	} {
		if err := e.waitPool(ctx, "alpha"); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"run", "--runtime", "kubernetes", "--namespace", e.sbNS, "--template", "alpha", "--gate-namespace", e.gateNS,
			"--name", tc.name}, tc.secret...)
		r := c.run(t, "", append(args, "--", "/client", "get", "https://alpha.moat.test/"+tc.name)...)
		t.Logf("%s: exit %d %s", tc.name, r.code, strings.TrimSpace(r.stdout))
		if !strings.Contains(r.stdout, tc.want) {
			t.Errorf("%s: %q %q; want %s", tc.name, r.stdout, r.stderr, tc.want)
		}
		if tc.secret != nil {
			if kr := c.kubeRecord(t, tc.name); kr.Secret != "alpha-token" {
				t.Errorf("recorded secret %q, want alpha-token", kr.Secret)
			}
			if r := c.run(t, "", "run", "--name", tc.name, "--secret", "other", "--", "/client", "say", "x", "", "0"); r.code != 2 || !strings.Contains(r.stderr, "--secret other") {
				t.Errorf("another --secret for the claim: exit %d %q; want 2 naming it", r.code, r.stderr)
			}
		}
		if got := e.up.saw("alpha.moat.test", "/"+tc.name, "Bearer "+e.token); got != (tc.secret != nil) {
			t.Errorf("%s: the upstream got the real value: %v", tc.name, got)
		}
		if r := c.run(t, "", "destroy", tc.name, "--yes"); r.code != 0 {
			t.Errorf("moat destroy %s: %q", tc.name, r.stderr)
		}
	}
}
