package gateserve

// The Kubernetes tenant source: client-go informers on Pods (the gate's
// node's), Sandboxes, SandboxClaims, SandboxTemplates, ConfigMaps and the
// Secrets labelled for the gate. Every change is applied at once, on the
// informer's own goroutine: the address table is computed again from
// what the informers hold (kube.go) and swapped whole. A pod that is
// deleted, or marked for deletion, is out of the table before the
// handler returns, and its open connections are cut.
//
// client-go is linked by moat-gate only (cmd/moat/deps_test.go).

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	agentsclient "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned"
	extclient "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned"
	extinformers "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/informers/externalversions"
	extlisters "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/listers/api/v1beta1"
	agentsinformers "sigs.k8s.io/agent-sandbox/clients/k8s/informers/externalversions"
	agentslisters "sigs.k8s.io/agent-sandbox/clients/k8s/listers/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/config"
)

// KubeClients are the API clients of [kubernetes].
type KubeClients struct {
	Core   kubernetes.Interface
	Agents agentsclient.Interface // agents.x-k8s.io: Sandboxes
	Ext    extclient.Interface    // extensions.agents.x-k8s.io: claims, templates
}

// kubeSource keeps the service's tenant table equal to the sandbox pods
// the informers know.
type kubeSource struct {
	s     *Service
	log   *slog.Logger
	cfg   *Kube
	c     KubeClients
	audit *audit.Log // every sandbox's records, stamped with who it is

	pods      corelisters.PodLister
	cms       corelisters.ConfigMapLister
	secrets   corelisters.SecretLister
	sandboxes agentslisters.SandboxLister
	claims    extlisters.SandboxClaimLister
	templates extlisters.SandboxTemplateLister
	start     func(stop <-chan struct{})
	synced    []cache.InformerSynced
	ready     atomic.Bool
	publishC  chan struct{}
	// published is publish's own (one goroutine): each policy version's
	// secret names or error, so an event does not compile every
	// template's policy again.
	published map[string]publishedPolicy

	idsMu sync.Mutex
	ids   map[string]kubeID // by the gate's sandbox key (gateKey)

	mu      sync.Mutex // one apply at a time; guards the fields below
	byPod   map[types.UID]*kubeTenant
	rules   map[string]*rulesResult // by ConfigMap UID and resourceVersion
	lastWhy map[string]string       // pods without a tenant, logged once per reason
}

type publishedPolicy struct {
	secrets []string
	err     error
}

type kubeTenant struct {
	t      *tenant
	fp     string
	cancel context.CancelFunc
}

type rulesResult struct {
	r   *rules
	err error
}

// newKubeSource makes the clients (unless given) and the informers. It
// talks to nothing yet: run does.
func newKubeSource(s *Service, given *KubeClients) (*kubeSource, error) {
	cfg := s.cfg.Kube
	k := &kubeSource{s: s, cfg: cfg, log: s.log.With("component", "kubernetes"), ids: map[string]kubeID{},
		byPod: map[types.UID]*kubeTenant{}, rules: map[string]*rulesResult{}, lastWhy: map[string]string{},
		publishC: make(chan struct{}, 1), published: map[string]publishedPolicy{}}
	if given != nil {
		k.c = *given
	} else {
		rc, err := restConfig(cfg.Kubeconfig)
		if err != nil {
			return nil, err
		}
		rc.UserAgent = "moat-gate"
		if k.c.Core, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("making the Kubernetes client: %w", err)
		}
		if k.c.Agents, err = agentsclient.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("making the agent-sandbox client: %w", err)
		}
		if k.c.Ext, err = extclient.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("making the agent-sandbox extensions client: %w", err)
		}
	}
	al, err := audit.OpenWith(cfg.Audit, audit.Options{Logger: s.log.With("component", "audit", "tenant", "kubernetes"), Stamp: k.stamp})
	if err != nil {
		return nil, fmt.Errorf("opening the Kubernetes sandboxes' audit log: %w", err)
	}
	al.Tap(func(r audit.Record) { s.metrics.tap(r.Namespace + "/" + r.Template)(r) })
	k.audit = al

	podF := informers.NewSharedInformerFactoryWithOptions(k.c.Core, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		if cfg.Node != "" {
			o.FieldSelector = "spec.nodeName=" + cfg.Node
		}
	}))
	secF := informers.NewSharedInformerFactoryWithOptions(k.c.Core, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = LabelGateSecret + "=true"
	}))
	cmF := informers.NewSharedInformerFactory(k.c.Core, 0)
	agF := agentsinformers.NewSharedInformerFactory(k.c.Agents, 0)
	exF := extinformers.NewSharedInformerFactory(k.c.Ext, 0)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.changed() },
		UpdateFunc: func(any, any) { k.changed() },
		DeleteFunc: func(any) { k.changed() },
	}
	for _, inf := range []cache.SharedIndexInformer{
		podF.Core().V1().Pods().Informer(), secF.Core().V1().Secrets().Informer(), cmF.Core().V1().ConfigMaps().Informer(),
		agF.Agents().V1beta1().Sandboxes().Informer(),
		exF.Extensions().V1beta1().SandboxClaims().Informer(), exF.Extensions().V1beta1().SandboxTemplates().Informer(),
	} {
		if _, err := inf.AddEventHandler(h); err != nil {
			al.Close()
			return nil, err
		}
		k.synced = append(k.synced, inf.HasSynced)
	}
	k.pods = podF.Core().V1().Pods().Lister()
	k.secrets = secF.Core().V1().Secrets().Lister()
	k.cms = cmF.Core().V1().ConfigMaps().Lister()
	k.sandboxes = agF.Agents().V1beta1().Sandboxes().Lister()
	k.claims = exF.Extensions().V1beta1().SandboxClaims().Lister()
	k.templates = exF.Extensions().V1beta1().SandboxTemplates().Lister()
	k.start = func(stop <-chan struct{}) {
		podF.Start(stop)
		secF.Start(stop)
		cmF.Start(stop)
		agF.Start(stop)
		exF.Start(stop)
	}
	return k, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubernetes.kubeconfig %s: %w", kubeconfig, err)
		}
		return rc, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("[kubernetes] without kubeconfig reads the pod's ServiceAccount, and found none (%w); run the gate in a pod with one, or set kubernetes.kubeconfig", err)
	}
	return rc, nil
}

// run watches until ctx ends. Until the informers have synced, the table
// is empty: every client is unknown (fail closed).
func (k *kubeSource) run(ctx context.Context) {
	k.start(ctx.Done())
	t0 := time.Now()
	if !cache.WaitForCacheSync(ctx.Done(), k.synced...) {
		return
	}
	k.ready.Store(true)
	k.log.Info("gate service: Kubernetes informers synced; serving sandbox pods", "node", k.cfg.Node, "after", time.Since(t0).Round(time.Millisecond))
	k.apply()
	k.kick()
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.publishC:
			k.publish(ctx)
		}
	}
}

// changed is every informer event: the table is computed again now, on
// the informer's goroutine, so a deletion is applied before the next
// event of that informer is handled.
func (k *kubeSource) changed() {
	if !k.ready.Load() {
		return // run applies once everything has synced
	}
	k.apply()
	k.kick()
}

// kick asks for the placeholder ConfigMaps to be brought up to date.
func (k *kubeSource) kick() {
	select {
	case k.publishC <- struct{}{}:
	default:
	}
}

func (k *kubeSource) health() error {
	if !k.ready.Load() {
		return errors.New("the Kubernetes informers have not synced yet; no sandbox is served")
	}
	if err := k.audit.Failing(); err != nil {
		return fmt.Errorf("the Kubernetes sandboxes' audit log: %w", err)
	}
	return nil
}

// apply computes the table from the informers' objects and publishes it.
// A pod keeps its tenant (gate, open connections) while nothing it is
// bound to changes; a pod that left the table has its connections cut.
func (k *kubeSource) apply() {
	k.mu.Lock()
	defer k.mu.Unlock()
	pods, err := k.pods.List(labels.Everything())
	if err != nil {
		k.log.Error("gate service: listing pods from the informer; keeping the table", "err", err)
		return
	}
	binds, skipped := bindPods(pods, k)
	next := map[types.UID]*kubeTenant{}
	byAddr := map[netip.Addr]*tenant{}
	usedRules := map[string]*rulesResult{}
	addrs := slices.Collect(maps.Keys(binds))
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	for _, a := range addrs {
		b := binds[a]
		kt := next[b.id.PodUID]
		if kt == nil {
			fp := b.fingerprint()
			if old := k.byPod[b.id.PodUID]; old != nil && old.fp == fp {
				kt = old
			} else {
				t, err := k.build(b, usedRules)
				if err != nil {
					skipped = append(skipped, unbound{b.id.Namespace + "/" + b.id.Pod, err.Error()})
					continue
				}
				ctx, cancel := context.WithCancel(context.Background())
				t.gone = ctx
				kt = &kubeTenant{t: t, fp: fp, cancel: cancel}
				if old != nil {
					// Rebound (claimed, a new policy or Secret version):
					// what is open was decided as before and carries on,
					// until the pod goes.
					prev := old.cancel
					kt.cancel = func() { cancel(); prev() }
					k.log.Info("gate service: sandbox pod rebound", "pod", b.id.Namespace+"/"+b.id.Pod, "sandbox", b.id.Sandbox, "claim", b.id.Claim)
				} else {
					k.log.Info("gate service: sandbox pod served", "pod", b.id.Namespace+"/"+b.id.Pod, "addr", a, "sandbox", b.id.Sandbox, "claim", b.id.Claim, "template", b.id.Template)
				}
			}
			next[b.id.PodUID] = kt
			k.remember(b.id)
		}
		byAddr[a] = kt.t
	}
	k.s.tenants.Store(&tenantTable{byName: map[string]*tenant{}, byAddr: byAddr})
	for uid, kt := range k.byPod {
		if _, ok := next[uid]; !ok {
			kt.cancel()
			k.forget(kt.t)
			k.log.Info("gate service: sandbox pod no longer served; its connections are cut", "sandbox_key", kt.t.gateKey)
		}
	}
	k.byPod = next
	// The compiled policies kept are those some pod is bound to now.
	current := map[string]bool{}
	for _, b := range binds {
		current[rulesKey(b.policy)] = true
	}
	maps.DeleteFunc(k.rules, func(key string, _ *rulesResult) bool { return !current[key] })
	maps.Copy(k.rules, usedRules)
	why := map[string]string{}
	for _, u := range skipped {
		why[u.pod] = u.why
		if k.lastWhy[u.pod] != u.why {
			k.log.Warn("gate service: a sandbox pod gets nothing (fail closed)", "pod", u.pod, "why", u.why)
		}
	}
	k.lastWhy = why
}

func rulesKey(cm *corev1.ConfigMap) string { return string(cm.UID) + "/" + cm.ResourceVersion }

// build makes a pod's tenant: its template's rules, its placeholders, and
// the values of its claim's Secret (none: every secret pending).
func (k *kubeSource) build(b kubeBinding, used map[string]*rulesResult) (*tenant, error) {
	r, err := k.rulesOf(b.policy, b.id.Template, used)
	if err != nil {
		return nil, err
	}
	names := slices.Sorted(maps.Keys(r.secrets))
	ph := map[string]string{}
	for _, n := range names {
		ph[n] = templatePlaceholder(b.id.Namespace, b.id.TemplateUID, n)
	}
	var values map[string][]byte
	if b.secret != nil {
		values = map[string][]byte{}
		for _, n := range names {
			key, _ := strings.CutPrefix(r.secrets[n].From, "env:")
			if v, ok := b.secret.Data[key]; ok {
				values[n] = v
			}
		}
	}
	tc := Tenant{Name: b.id.Namespace + "/" + b.id.Template, Pushed: names,
		RulesAt: fmt.Sprintf("ConfigMap %s/%s (key %s)", b.policy.Namespace, b.policy.Name, PolicyKey)}
	set, pending, err := resolveTenant(tc, r, ph, values)
	if err != nil {
		return nil, fmt.Errorf("reading its secrets from Secret %s: %w", boundSecretName(b), err)
	}
	creds := &credentials{waiting: "the sandbox is a warm pool's until a claim takes it"}
	if b.id.Claim != "" {
		creds.waiting = fmt.Sprintf("claim %s binds no Secret labelled %s=true that has their keys (annotation %s on the claim or its template)",
			b.id.Claim, LabelGateSecret, AnnotationSecret)
	}
	creds.store(set, pending)
	key := gateKey(b.id)
	t := k.s.assemble(tc, key, r, creds, k.audit)
	t.gateKey = key
	return t, nil
}

func boundSecretName(b kubeBinding) string {
	if b.secret == nil {
		return "(none)"
	}
	return b.secret.Name
}

// rulesOf compiles a template's policy ConfigMap, once per version.
func (k *kubeSource) rulesOf(cm *corev1.ConfigMap, template string, used map[string]*rulesResult) (*rules, error) {
	key := rulesKey(cm)
	rr := used[key]
	if rr == nil {
		rr = k.rules[key]
	}
	if rr == nil {
		r, err := compilePolicy(cm, template, k.s.roots)
		rr = &rulesResult{r, err}
	}
	used[key] = rr
	return rr.r, rr.err
}

// compilePolicy reads a template's policy from its ConfigMap. A secret's
// from must be env:KEY, KEY a key of the Secret a claim binds; the
// service reads no files or commands for a sandbox.
func compilePolicy(cm *corev1.ConfigMap, template string, system *x509.CertPool) (*rules, error) {
	where := fmt.Sprintf("ConfigMap %s/%s key %s", cm.Namespace, cm.Name, PolicyKey)
	f, err := config.Parse(where, []byte(cm.Data[PolicyKey]))
	if err != nil {
		return nil, err
	}
	for name, s := range f.Secrets {
		if !strings.HasPrefix(s.From, "env:") {
			return nil, fmt.Errorf("%s: [secrets.%s] from = %q: on Kubernetes a value is a key of the Secret the claim names; write from = \"env:KEY\"", where, name, s.From)
		}
	}
	if len(f.Network.Trust) > 0 {
		return nil, fmt.Errorf("%s: [network] trust names files, and the gate reads none for a sandbox; give the gate its upstream trust roots instead (SSL_CERT_FILE in its pod)", where)
	}
	return compileRules(Tenant{Name: cm.Namespace + "/" + template}, []*config.File{f}, system)
}

// gateKey is the name a tenant's gate puts in its records' sandbox
// field; stamp turns it into the sandbox's name and identity. One per
// pod: two pods of one Sandbox (one replacing the other) stay apart.
func gateKey(id kubeID) string { return id.Namespace + "/" + id.Sandbox + "/" + string(id.PodUID) }

func (k *kubeSource) remember(id kubeID) {
	k.idsMu.Lock()
	k.ids[gateKey(id)] = id
	k.idsMu.Unlock()
}

// forget drops a removed tenant's identity once the records of its cut
// connections have been written.
func (k *kubeSource) forget(t *tenant) {
	key := t.gateKey
	time.AfterFunc(time.Minute, func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, kt := range k.byPod {
			if kt.t.gateKey == key {
				return // the pod is served again
			}
		}
		k.idsMu.Lock()
		delete(k.ids, key)
		k.idsMu.Unlock()
	})
}

// stamp completes a record with who its client is.
func (k *kubeSource) stamp(r *audit.Record) {
	k.idsMu.Lock()
	id, ok := k.ids[r.Sandbox]
	k.idsMu.Unlock()
	if !ok {
		parts := strings.SplitN(r.Sandbox, "/", 3)
		if len(parts) == 3 {
			r.Namespace, r.Sandbox, r.PodUID = parts[0], parts[1], parts[2]
		}
		return
	}
	r.Sandbox, r.Namespace, r.SandboxUID = id.Sandbox, id.Namespace, string(id.SandboxUID)
	r.Pod, r.PodUID, r.Template = id.Pod, string(id.PodUID), id.Template
	r.Claim, r.ClaimUID = id.Claim, string(id.ClaimUID)
}

// The informers' objects, for bindPods.

func (k *kubeSource) Sandbox(ns, name string) *sandboxv1.Sandbox {
	o, _ := k.sandboxes.Sandboxes(ns).Get(name)
	return o
}
func (k *kubeSource) Claim(ns, name string) *extv1.SandboxClaim {
	o, _ := k.claims.SandboxClaims(ns).Get(name)
	return o
}
func (k *kubeSource) Template(ns, name string) *extv1.SandboxTemplate {
	o, _ := k.templates.SandboxTemplates(ns).Get(name)
	return o
}
func (k *kubeSource) ConfigMap(ns, name string) *corev1.ConfigMap {
	o, _ := k.cms.ConfigMaps(ns).Get(name)
	return o
}
func (k *kubeSource) Secret(ns, name string) *corev1.Secret {
	o, _ := k.secrets.Secrets(ns).Get(name)
	return o
}

// publishTimeout bounds one write of a placeholders ConfigMap.
const publishTimeout = 10 * time.Second

// publish writes, for every template with a policy, the ConfigMap its
// sandboxes take their placeholders and the CA from: before any pod of a
// warm pool can start, and the same from every gate pod.
func (k *kubeSource) publish(ctx context.Context) {
	tpls, err := k.templates.List(labels.Everything())
	if err != nil {
		return
	}
	seen := map[string]bool{}
	defer func() { maps.DeleteFunc(k.published, func(key string, _ publishedPolicy) bool { return !seen[key] }) }()
	for _, tpl := range tpls {
		cmName := tpl.Annotations[AnnotationPolicy]
		if cmName == "" || tpl.DeletionTimestamp != nil {
			continue
		}
		want := map[string]string{CAKey: string(k.s.ca.CertPEM()), StatusKey: "ok"}
		policy := k.ConfigMap(tpl.Namespace, cmName)
		switch {
		case policy == nil:
			want[StatusKey] = fmt.Sprintf("no sandbox of this template is served: its policy ConfigMap %s does not exist", cmName)
		default:
			key := rulesKey(policy) + "/" + tpl.Name
			seen[key] = true
			pp, ok := k.published[key]
			if !ok {
				r, err := compilePolicy(policy, tpl.Name, k.s.roots)
				pp.err = err
				if err == nil {
					pp.secrets = slices.Collect(maps.Keys(r.secrets))
				}
				k.published[key] = pp
			}
			if pp.err != nil {
				want[StatusKey] = "no sandbox of this template is served: " + pp.err.Error()
				break
			}
			for _, n := range pp.secrets {
				want[n] = templatePlaceholder(tpl.Namespace, tpl.UID, n)
			}
		}
		name := PlaceholdersConfigMap(tpl.Name)
		have := k.ConfigMap(tpl.Namespace, name)
		if have != nil && maps.Equal(have.Data, want) {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, publishTimeout)
		err = k.writeConfigMap(cctx, tpl, name, want, have)
		cancel()
		if err != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			k.log.Error("gate service: writing a template's placeholders ConfigMap", "namespace", tpl.Namespace, "configmap", name, "err", err)
		}
	}
}

func (k *kubeSource) writeConfigMap(ctx context.Context, tpl *extv1.SandboxTemplate, name string, data map[string]string, have *corev1.ConfigMap) error {
	cms := k.c.Core.CoreV1().ConfigMaps(tpl.Namespace)
	if have != nil {
		cm := have.DeepCopy()
		cm.Data = data
		_, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tpl.Namespace,
			Labels: map[string]string{LabelPlaceholdersFor: tpl.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: extv1.GroupVersion.String(), Kind: "SandboxTemplate",
				Name: tpl.Name, UID: tpl.UID}}},
		Data: data,
	}
	_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	return err
}
