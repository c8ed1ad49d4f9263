// Package engine is the Kubernetes API's side of moat's runtime =
// "kubernetes" (internal/kubert): client-go, agent-sandbox's clients and
// the exec stream, linked only into moat-kube, never into moat.
package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	extclient "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"moat.dev/moat/internal/kubert"
)

const usage = `moat-kube runs moat's runtime = "kubernetes" for moat (moat run --runtime
kubernetes); moat starts it, never a person. See: moat run --help`

// Main is moat-kube's main: the command in args[1], its exit code.
func Main(args []string, version string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		return 2
	}
	// SIGINT too: Ctrl-C reaches moat-kube with moat (one process
	// group), and a claim being waited for must be deleted, not left.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch args[1] {
	case "version", "--version":
		fmt.Println("moat-kube", version)
		return 0
	case "exec":
		return execMain(ctx, args[2:])
	case "claim":
		var req kubert.ClaimRequest
		if err = readJSON(&req); err == nil {
			var r *kubert.Record
			if r, err = claim(ctx, req); err == nil {
				err = json.NewEncoder(os.Stdout).Encode(r)
			}
		}
	case "release":
		var r kubert.Record
		if err = readJSON(&r); err == nil {
			err = release(ctx, r)
		}
	case "audit":
		var req kubert.AuditRequest
		if err = readJSON(&req); err == nil {
			err = auditRecords(ctx, req, os.Stdout)
		}
	default:
		fmt.Fprintf(os.Stderr, "moat-kube: %q is not a command of it; %s\n", args[1], usage)
		return 2
	}
	if err != nil {
		for _, l := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(os.Stderr, kubert.ErrorPrefix+l)
		}
	}
	return kubert.ExitCode(err)
}

func readJSON(v any) error {
	b, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	if err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return kubert.Errorf(kubert.ErrUsage, "reading the request: %v", err)
	}
	return nil
}

// clients are the API's clients for one kubeconfig context.
type clients struct {
	rc        *rest.Config
	cs        kubernetes.Interface
	ext       extclient.Interface
	namespace string // the context's namespace, else "default"
	context   string // the context used: the one asked for, else the current one
}

// connect loads the kubeconfig as kubectl does (KUBECONFIG, else
// ~/.kube/config) with context ctxName ("": its current context).
func connect(ctxName string) (*clients, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: ctxName})
	raw, err := cc.RawConfig()
	if err != nil {
		return nil, kubert.Errorf(kubert.ErrUnreachable, "loading the kubeconfig (KUBECONFIG, else ~/.kube/config): %v", err)
	}
	if ctxName != "" {
		if _, ok := raw.Contexts[ctxName]; !ok {
			var names []string
			for n := range raw.Contexts {
				names = append(names, n)
			}
			sort.Strings(names)
			return nil, kubert.Errorf(kubert.ErrUsage, "--context %q: the kubeconfig has no such context; it has: %s", ctxName, strings.Join(names, ", "))
		}
	} else if raw.CurrentContext == "" && len(raw.Contexts) == 0 {
		return nil, kubert.Errorf(kubert.ErrUnreachable, "no kubeconfig: set KUBECONFIG or write ~/.kube/config, and name a context with --context")
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, kubert.Errorf(kubert.ErrUnreachable, "loading the kubeconfig: %v", err)
	}
	rc.Timeout = 30 * time.Second
	ns, _, err := cc.Namespace()
	if err != nil || ns == "" {
		ns = "default"
	}
	c := &clients{rc: rc, namespace: ns, context: ctxName}
	if c.context == "" {
		c.context = raw.CurrentContext
	}
	if c.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, kubert.Errorf(kubert.ErrUnreachable, "%v", err)
	}
	if c.ext, err = extclient.NewForConfig(rc); err != nil {
		return nil, kubert.Errorf(kubert.ErrUnreachable, "%v", err)
	}
	return c, nil
}

// apiErr gives an API error its class: not found, refused as invalid,
// or the API server out of reach; forbidden says what to ask for.
func apiErr(err error, what string) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return kubert.Errorf(kubert.ErrNotFound, "%s: %v", what, err)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return kubert.Errorf(kubert.ErrUsage, "%s: %v", what, err)
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: %v (ask the cluster's admin for that access)", what, err)
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return kubert.Errorf(kubert.ErrUnreachable, "%s: %v", what, err)
}

// claimPollEvery is how often the claim's wait looks again: a warm
// pool's claim is bound in a fraction of a second (docs/kubernetes.md).
const claimPollEvery = 200 * time.Millisecond

// claim takes a sandbox of req.Template from its warm pool and waits
// until the claim is bound and its pod Ready. A claim that is not ready
// in time is deleted: nothing is left that moat does not record.
func claim(ctx context.Context, req kubert.ClaimRequest) (*kubert.Record, error) {
	if req.Template == "" {
		return nil, kubert.Errorf(kubert.ErrUsage, "no template: name the SandboxTemplate with --template")
	}
	c, err := connect(req.Context)
	if err != nil {
		return nil, err
	}
	ns := req.Namespace
	if ns == "" {
		ns = c.namespace
	}
	gateNS := req.GateNamespace
	if gateNS == "" {
		gateNS = kubert.DefaultGateNamespace
	}
	pool, err := c.poolOf(ctx, ns, req.Template)
	if err != nil {
		return nil, err
	}
	var ann map[string]string
	if req.Secret != "" {
		ann = map[string]string{kubert.AnnotationSecret: req.Secret}
	}
	cl, err := c.ext.ExtensionsV1beta1().SandboxClaims(ns).Create(ctx, &extv1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "moat-" + req.Name + "-", Labels: map[string]string{"moat.dev/sandbox": req.Name}, Annotations: ann},
		Spec:       extv1.SandboxClaimSpec{WarmPoolRef: extv1.SandboxWarmPoolRef{Name: pool}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, apiErr(err, fmt.Sprintf("creating a SandboxClaim of warm pool %s in namespace %s", pool, ns))
	}
	// The context as resolved now: a later kubectl config use-context
	// must not send this sandbox's exec to another cluster.
	rec := &kubert.Record{Schema: kubert.Schema, Context: c.context, Namespace: ns, Template: req.Template, Pool: pool,
		GateNamespace: gateNS, Claim: cl.Name, ClaimUID: string(cl.UID), Secret: req.Secret}
	wait := req.Wait
	if wait <= 0 {
		wait = 2 * time.Minute
	}
	if err := c.waitBound(ctx, rec, wait); err != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if derr := c.deleteClaim(dctx, *rec); derr != nil {
			return nil, fmt.Errorf("%w\nand deleting the claim failed: %v; delete SandboxClaim %s in namespace %s yourself", err, derr, rec.Claim, ns)
		}
		return nil, fmt.Errorf("%w\nthe claim was deleted", err)
	}
	return rec, nil
}

// poolOf is the warm pool of template in ns: the one whose templateRef
// names it, or, of several, the one named as the template.
func (c *clients) poolOf(ctx context.Context, ns, template string) (string, error) {
	pools, err := c.ext.ExtensionsV1beta1().SandboxWarmPools(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", apiErr(err, "listing the SandboxWarmPools of namespace "+ns)
	}
	var names []string
	for _, p := range pools.Items {
		if p.Spec.TemplateRef.Name == template && p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	switch {
	case len(names) == 1:
		return names[0], nil
	case slices.Contains(names, template):
		return template, nil
	case len(names) > 1:
		return "", kubert.Errorf(kubert.ErrUsage, "--template %s: namespace %s has several warm pools of it (%s) and none named %s; keep one, or name one after the template",
			template, ns, strings.Join(names, ", "), template)
	}
	if _, err := c.ext.ExtensionsV1beta1().SandboxTemplates(ns).Get(ctx, template, metav1.GetOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return "", kubert.Errorf(kubert.ErrNotFound, "--template %s: namespace %s has no SandboxTemplate of that name (--namespace picks another namespace)", template, ns)
		}
		return "", apiErr(err, "reading SandboxTemplate "+template)
	}
	return "", kubert.Errorf(kubert.ErrNotFound, "--template %s: namespace %s has no SandboxWarmPool of it; a claim takes its sandbox from a warm pool: create a SandboxWarmPool whose templateRef names %s",
		template, ns, template)
}

// waitBound waits until the claim has a sandbox whose pod carries the
// claim's UID and is Ready; it fills the record's sandbox, pod and node.
func (c *clients) waitBound(ctx context.Context, rec *kubert.Record, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var seen string
	for {
		ok, why, err := c.bound(ctx, rec)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		seen = why
		if time.Now().After(deadline) {
			return fmt.Errorf("SandboxClaim %s (namespace %s, warm pool %s) was not ready after %s: %s; the claim's status conditions and its pod's events say why",
				rec.Claim, rec.Namespace, rec.Pool, limit, seen)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for SandboxClaim %s: %w (last: %s)", rec.Claim, ctx.Err(), seen)
		case <-time.After(claimPollEvery):
		}
	}
}

// bound looks once: whether the claim is bound and its pod Ready, and if
// not, what it saw.
func (c *clients) bound(ctx context.Context, rec *kubert.Record) (bool, string, error) {
	cl, err := c.ext.ExtensionsV1beta1().SandboxClaims(rec.Namespace).Get(ctx, rec.Claim, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return false, "", kubert.Errorf(kubert.ErrNotFound, "SandboxClaim %s in namespace %s was deleted while moat waited for it", rec.Claim, rec.Namespace)
		}
		return false, "reading the claim: " + err.Error(), nil
	}
	if string(cl.UID) != rec.ClaimUID {
		return false, "", kubert.Errorf(kubert.ErrNotFound, "SandboxClaim %s was replaced while moat waited for it", rec.Claim)
	}
	conds := conditions(cl.Status.Conditions)
	if cl.Status.SandboxStatus.Name == "" {
		return false, "no sandbox bound yet; conditions: " + conds, nil
	}
	rec.Sandbox = cl.Status.SandboxStatus.Name
	pod, err := c.podOf(ctx, *rec)
	if err != nil {
		return false, "sandbox " + rec.Sandbox + ": " + err.Error() + "; conditions: " + conds, nil
	}
	rec.Pod, rec.Node = pod.Name, pod.Spec.NodeName
	if !podReady(pod) {
		return false, fmt.Sprintf("pod %s is %s, not Ready (%s); conditions: %s", pod.Name, pod.Status.Phase, containerStates(pod), conds), nil
	}
	return true, "", nil
}

// podOf is the claim's pod: the one labelled with its UID by
// agent-sandbox, Running and not being deleted.
func (c *clients) podOf(ctx context.Context, rec kubert.Record) (*corev1.Pod, error) {
	if rec.ClaimUID == "" {
		return nil, kubert.Errorf(kubert.ErrUsage, "the record has no claim UID")
	}
	pods, err := c.cs.CoreV1().Pods(rec.Namespace).List(ctx, metav1.ListOptions{LabelSelector: extv1.SandboxIDLabel + "=" + rec.ClaimUID})
	if err != nil {
		return nil, apiErr(err, "listing the claim's pods")
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return p, nil
		}
	}
	return nil, kubert.Errorf(kubert.ErrNotFound, "no pod carries the claim's UID (label %s=%s) yet", extv1.SandboxIDLabel, rec.ClaimUID)
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func containerStates(p *corev1.Pod) string {
	var out []string
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			out = append(out, c.Name+" waiting: "+c.State.Waiting.Reason+" "+c.State.Waiting.Message)
		case c.State.Terminated != nil:
			out = append(out, fmt.Sprintf("%s terminated: exit %d %s", c.Name, c.State.Terminated.ExitCode, c.State.Terminated.Reason))
		case c.State.Running != nil:
			out = append(out, c.Name+" running")
		}
	}
	if len(out) == 0 {
		return "no container started"
	}
	return strings.Join(out, "; ")
}

func conditions(cs []metav1.Condition) string {
	if len(cs) == 0 {
		return "none yet"
	}
	var out []string
	for _, c := range cs {
		s := c.Type + "=" + string(c.Status)
		if c.Reason != "" {
			s += " (" + c.Reason
			if c.Message != "" {
				s += ": " + c.Message
			}
			s += ")"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

// release deletes the record's claim and waits until it is gone, so that
// moat destroy returning means the sandbox is released.
func release(ctx context.Context, r kubert.Record) error {
	c, err := connect(r.Context)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.deleteClaim(ctx, r); err != nil {
		return err
	}
	for {
		cl, err := c.ext.ExtensionsV1beta1().SandboxClaims(r.Namespace).Get(ctx, r.Claim, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && string(cl.UID) != r.ClaimUID) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("SandboxClaim %s in namespace %s is being deleted but is still there after a minute (a finalizer?)", r.Claim, r.Namespace)
		case <-time.After(claimPollEvery):
		}
	}
}

// deleteClaim deletes the claim only if it is still the one recorded
// (its UID): a claim of the same name made since is not moat's.
func (c *clients) deleteClaim(ctx context.Context, r kubert.Record) error {
	pre := metav1.Preconditions{}
	if r.ClaimUID != "" {
		uid := types.UID(r.ClaimUID)
		pre.UID = &uid
	}
	// Background: the claim goes at once and the garbage collector takes
	// its Sandbox and pod after it; foreground would hold destroy for the
	// pod's whole termination grace period.
	bg := metav1.DeletePropagationBackground
	err := c.ext.ExtensionsV1beta1().SandboxClaims(r.Namespace).Delete(ctx, r.Claim, metav1.DeleteOptions{Preconditions: &pre, PropagationPolicy: &bg})
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	if apierrors.IsConflict(err) {
		return nil // another object by that name: ours is gone
	}
	return apiErr(err, "deleting SandboxClaim "+r.Claim)
}
