package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/kubert"
	"moat.dev/moat/internal/state"
)

// runtimeKube is [sandbox] runtime = "kubernetes" and --runtime
// kubernetes: the sandbox is an agent-sandbox SandboxClaim on a cluster
// whose gate is moat's DaemonSet (docs/kubernetes.md), reached through
// moat-kube, next to moat (kubert.Helper), which holds client-go.
const runtimeKube = "kubernetes"

// kubeBinary is moat-kube: client-go and agent-sandbox's clients.
const kubeBinary = "moat-kube"

// kubeClaimed is a Kubernetes sandbox's state in its record: it has a
// claim, which lives on the cluster, not in a daemon here, until moat
// destroy releases it.
const kubeClaimed = "claimed"

// kubeWait bounds a claim's wait for its pod: a warm pool's claim is
// Ready in under a second on the test cluster (docs/kubernetes.md); a
// cold start (an empty pool) pulls and boots a gVisor pod.
const kubeWait = 3 * time.Minute

// kubeFlags are run's flags for a new Kubernetes sandbox.
type kubeFlags struct {
	context, namespace, template, gateNamespace, secret string
}

// kubeFlag is one of kubeFlags, by its name on the command line.
type kubeFlag struct{ name, val string }

// named lists the flags with their names, in the order errors name them.
func (f kubeFlags) named() []kubeFlag {
	return []kubeFlag{{"--context", f.context}, {"--namespace", f.namespace}, {"--template", f.template},
		{"--gate-namespace", f.gateNamespace}, {"--secret", f.secret}}
}

// given names the first flag set, for errors ("" when none is).
func (f kubeFlags) given() string {
	for _, v := range f.named() {
		if v.val != "" {
			return v.name
		}
	}
	return ""
}

func kubeHelper() (kubert.Helper, error) {
	p, err := sibling(kubeBinary)
	if err != nil {
		return kubert.Helper{}, err
	}
	return kubert.Helper{Path: p, Stderr: os.Stderr}, nil
}

// fromKube gives moat-kube's errors moat's exit codes: a cluster moat
// cannot reach is the host's, a template or claim that is not there is
// not found, a request the API refuses is bad usage.
func fromKube(err error) error {
	switch {
	case errors.Is(err, kubert.ErrUnreachable):
		return withCode(ExitHost, err)
	case errors.Is(err, kubert.ErrNotFound):
		return withCode(ExitNotFound, err)
	case errors.Is(err, kubert.ErrUsage):
		return withCode(ExitUsage, err)
	}
	return err
}

// kubeRun is moat run for a Kubernetes sandbox: the named or the current
// directory's sandbox when it is one, or a new one when the runtime
// (--runtime, else [sandbox] runtime) is kubernetes. handled is false
// when the sandbox is another runtime's, which run goes on with.
func (e *env) kubeRun(name string, f kubeFlags, preset bool, argv []string) (handled bool, err error) {
	ws, err := cwd()
	if err != nil {
		return true, err
	}
	ws = findWorkspace(ws)
	var dir string
	var rec *state.Record
	if name != "" {
		if d, r, err := e.byName(name); err == nil {
			dir, rec = d, r
		} else if exitCode(err) != ExitNotFound {
			return true, err
		}
	} else if dir, rec, err = e.forWorkspace(ws); err != nil {
		return true, err
	}
	var cfg config.Config
	switch {
	case rec == nil:
		if cfg, err = config.Load(e.dirs.UserConfig(), filepath.Join(ws, "moat.toml")); err != nil {
			return true, withCode(ExitUsage, err)
		}
		rt, err := sandboxRuntime(e.runtime, cfg)
		if err != nil {
			return true, err
		}
		if rt != runtimeKube {
			if g := f.given(); g != "" {
				return true, codef(ExitUsage, "%s is for a sandbox on Kubernetes: add --runtime kubernetes (or set [sandbox] runtime = \"kubernetes\")", g)
			}
			return false, nil
		}
	case rec.Runtime != runtimeKube:
		if g := f.given(); g != "" {
			return true, codef(ExitUsage, "%s is for a sandbox on Kubernetes, and sandbox %q runs on %s", g, rec.Name, runtimeName(rec.Runtime))
		}
		if e.runtime == runtimeKube {
			return true, codef(ExitUsage, "sandbox %q exists and runs on %s; a sandbox keeps its runtime: destroy it first (moat destroy %s), or give another --name", rec.Name, runtimeName(rec.Runtime), rec.Name)
		}
		return false, nil
	}
	if preset {
		return true, codef(ExitUsage, "presets do not run on Kubernetes yet: the sandbox's policy and credentials are its template's (docs/kubernetes.md); run the agent's command after --")
	}
	if rec == nil {
		if name == "" {
			name = cfg.Sandbox.Name
		}
		if name == "" {
			name = e.deriveName(ws)
		}
		if dir, rec, err = e.kubeCreate(ws, name, f); err != nil {
			return true, err
		}
	} else if err := kubeSame(dir, rec, f); err != nil {
		return true, err
	}
	return true, e.kubeAttach(dir, rec, argv)
}

func runtimeName(rt string) string {
	if rt == "" {
		return "gvisor"
	}
	return rt
}

// kubeNoDaemon refuses, for a Kubernetes sandbox, what only a sandbox
// with a daemon here does (up, down, resume, ssh-config): its pod lives
// as long as its claim.
func kubeNoDaemon(rec *state.Record) error {
	return codef(ExitUsage, "sandbox %q is a claim on Kubernetes, running until it is released; it has no daemon to start or stop: use moat run, moat exec, or moat destroy %s to release it (docs/kubernetes.md)", rec.Name, rec.Name)
}

// anySandboxNamed is sandboxNamed for the commands that serve a
// Kubernetes sandbox too: run, exec, shell, network audit.
func anySandboxNamed(name string) (*env, string, *state.Record, error) {
	e, err := newEnv()
	if err != nil {
		return nil, "", nil, err
	}
	dir, rec, err := e.byName(name)
	if err != nil {
		return nil, "", nil, err
	}
	return e, dir, rec, nil
}

// kubeNotHere refuses, for a Kubernetes sandbox, a command that acts on
// what only a sandbox of this machine has (its daemon's rules, forwards,
// ssh, logs): silently changing a record the cluster never reads would
// tell the user a policy changed when it did not.
func kubeNotHere(rec *state.Record) error {
	return codef(ExitUsage, "sandbox %q is a claim on Kubernetes: its network policy is its template's (the ConfigMap its moat.dev/policy annotation names; docs/kubernetes.md), and it has no daemon here; for it use moat run, exec, shell, status, network audit, network denials and destroy", rec.Name)
}

// kubeSame refuses flags that would make an existing sandbox another
// claim: a sandbox keeps the claim it was made with.
func kubeSame(dir string, rec *state.Record, f kubeFlags) error {
	kr, err := kubert.LoadRecord(dir)
	if err != nil {
		return err
	}
	have := kubeFlags{context: kr.Context, namespace: kr.Namespace, template: kr.Template, gateNamespace: kr.GateNamespace, secret: kr.Secret}.named()
	for i, v := range f.named() {
		if v.val != "" && v.val != have[i].val {
			return codef(ExitUsage, "%s %s: sandbox %q is a claim with %s %q, kept for its life; for another, give another --name, or destroy it first: moat destroy %s",
				v.name, v.val, rec.Name, v.name, have[i].val, rec.Name)
		}
	}
	return nil
}

// kubeCreate makes a Kubernetes sandbox: its name reserved here first (a
// state directory), then the claim, then kube.json. A claim that fails
// leaves nothing; a record that cannot be written releases the claim.
func (e *env) kubeCreate(ws, name string, f kubeFlags) (string, *state.Record, error) {
	if err := config.ValidName(name); err != nil {
		return "", nil, withCode(ExitUsage, err)
	}
	if f.template == "" {
		return "", nil, codef(ExitUsage, "a sandbox on Kubernetes is a claim of a SandboxTemplate: name it with --template (and its namespace with --namespace; default: the context's)")
	}
	h, err := kubeHelper()
	if err != nil {
		return "", nil, err
	}
	rec := &state.Record{
		Name: name, Workspace: ws, Image: "template " + f.template, Runtime: runtimeKube,
		Desired: "running", State: kubeClaimed, Created: time.Now().UTC(),
	}
	dir := e.dirs.Sandbox(name)
	if err := state.Create(dir, rec); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", nil, codef(ExitUsage, "the name %q is taken; choose another with --name", name)
		}
		return "", nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, unix.SIGTERM)
	defer stop()
	kr, err := h.Claim(ctx, kubert.ClaimRequest{Name: name, Context: f.context, Namespace: f.namespace, Template: f.template,
		GateNamespace: f.gateNamespace, Secret: f.secret, Wait: kubeWait})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, withCode(ExitRun, fromKube(fmt.Errorf("claiming a sandbox of template %s: %w", f.template, err)))
	}
	if err := kubert.WriteRecord(dir, *kr); err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if rerr := h.Release(rctx, *kr); rerr != nil {
			return "", nil, fmt.Errorf("%w; and releasing SandboxClaim %s in namespace %s failed: %v", err, kr.Claim, kr.Namespace, rerr)
		}
		os.RemoveAll(dir)
		return "", nil, err
	}
	fmt.Fprintf(os.Stderr, "moat: created sandbox %q: SandboxClaim %s in namespace %s (template %s, pod %s)\n", name, kr.Claim, kr.Namespace, kr.Template, kr.Pod)
	return dir, rec, nil
}

// kubeAttach runs argv (nil: a shell) in the claim's pod, with a
// terminal when moat's stdin (and, for a command, stdout) is one, as on
// gVisor; the command's own exit code is moat's.
func (e *env) kubeAttach(dir string, rec *state.Record, argv []string) error {
	kr, err := kubert.LoadRecord(dir)
	if err != nil {
		return withCode(ExitRun, err)
	}
	h, err := kubeHelper()
	if err != nil {
		return withCode(ExitRun, err)
	}
	tty := sessionTTY(argv)
	if len(argv) == 0 {
		argv = []string{"/bin/sh"}
	}
	// The context is never cancelled: Ctrl-C goes to the pod's terminal,
	// or, without one, ends moat-kube and moat alike.
	code, err := h.Exec(context.Background(), kubert.ExecArgs{Record: kr, TTY: tty, Argv: argv}, os.Stdin, os.Stdout, os.Stderr)
	if err != nil {
		return withCode(ExitRun, fromKube(fmt.Errorf("sandbox %q: %w", rec.Name, err)))
	}
	if code != 0 {
		return commandExit(code)
	}
	return nil
}

// kubeDestroy releases the sandbox's claim (its Sandbox and pod go with
// it) and forgets it here.
func (e *env) kubeDestroy(dir string, rec *state.Record) error {
	kr, err := kubert.LoadRecord(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("not destroyed: %w", err)
	}
	if err == nil {
		h, err := kubeHelper()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := h.Release(ctx, kr); err != nil {
			return fromKube(fmt.Errorf("not destroyed: releasing SandboxClaim %s in namespace %s: %w", kr.Claim, kr.Namespace, err))
		}
	}
	if err := e.removeAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	if kr.Claim == "" {
		// Its claim was never recorded (a create cut short): nothing on
		// the cluster is moat's to release.
		fmt.Fprintf(os.Stderr, "moat: destroyed %s (it had no claim recorded)\n", rec.Name)
		return nil
	}
	fmt.Fprintf(os.Stderr, "moat: destroyed %s (released SandboxClaim %s in namespace %s)\n", rec.Name, kr.Claim, kr.Namespace)
	return nil
}

// kubeEntry is a Kubernetes sandbox in moat list and status: its claim
// is its state, and its template its image.
func kubeEntry(r *state.Record, dir string) listEntry {
	le := listEntry{Schema: 1, Name: r.Name, State: kubeClaimed, Image: r.Image, Workspace: r.Workspace,
		Created: r.Created, Runtime: runtimeKube, dir: dir}
	if kr, err := kubert.LoadRecord(dir); err == nil {
		le.Image = fmt.Sprintf("template %s/%s", kr.Namespace, kr.Template)
		le.Claim = &kr
	} else {
		le.Error = err.Error()
	}
	return le
}

// printKubeStatus is moat status for a Kubernetes sandbox: where its
// claim is, and where to look next.
func printKubeStatus(out io.Writer, le listEntry, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(out).Encode(le)
	}
	fmt.Fprintf(out, "name:       %s\nstate:      %s\nruntime:    kubernetes\nimage:      %s\nworkspace:  %s\n", le.Name, le.State, le.Image, le.Workspace)
	if k := le.Claim; k != nil {
		ctx := k.Context
		if ctx == "" {
			ctx = "(the kubeconfig's current)"
		}
		fmt.Fprintf(out, "claim:      %s (uid %s) in namespace %s, warm pool %s\ncontext:    %s\npod:        %s on node %s (when claimed)\naudit:      moat network audit %s (from the gate in namespace %s)\n",
			k.Claim, k.ClaimUID, k.Namespace, k.Pool, ctx, k.Pod, k.Node, le.Name, k.GateNamespace)
	}
	if le.Error != "" {
		fmt.Fprintf(out, "error:      %s\n", le.Error)
	}
	return nil
}

// kubeAudit hands fn the sandbox's audit records, read from its node's
// gate through the API (moat-kube audit); with follow, until ctx ends.
func kubeAudit(ctx context.Context, dir string, follow bool, fn func(audit.Record)) error {
	kr, err := kubert.LoadRecord(dir)
	if err != nil {
		return err
	}
	h, err := kubeHelper()
	if err != nil {
		return err
	}
	if err := h.Audit(ctx, kubert.AuditRequest{Record: kr, Follow: follow}, fn); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fromKube(fmt.Errorf("reading the audit of SandboxClaim %s: %w", kr.Claim, err))
	}
	return nil
}
