package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// fieldManager owns, in server-side apply, every field this tool sets.
const fieldManager = "moat-cluster"

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return nil, errors.New("-kubeconfig is required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = fieldManager
	return cfg, nil
}

// runApply applies every YAML document of the files given, with server-side
// apply: what kubectl apply --server-side does, for the few objects the
// cluster starts with, without building kubectl. A kind that a CRD earlier
// in the list defines becomes known once the CRD is established, so an
// unknown kind is retried until -timeout.
func runApply(args []string) error {
	fs := flag.NewFlagSet("apply", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "the admin kubeconfig (required)")
	timeout := fs.Duration("timeout", 60*time.Second, "how long to wait for a kind to become known")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	for _, file := range fs.Args() {
		docs, err := readDocs(file)
		if err != nil {
			return err
		}
		for i, obj := range docs {
			if err := applyOne(ctx, dyn, mapper, obj); err != nil {
				return fmt.Errorf("%s: document %d (%s %s): %w", file, i+1, obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	return nil
}

func readDocs(file string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

func applyOne(ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	var mapping *meta.RESTMapping
	for {
		var err error
		mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			break
		}
		if !meta.IsNoMatchError(err) {
			return err
		}
		mapper.Reset()
		select {
		case <-ctx.Done():
			return fmt.Errorf("kind %s is still unknown to the API server: %w", gvk, err)
		case <-time.After(time.Second):
		}
	}
	data, err := obj.MarshalJSON()
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = "default"
		}
		ri = dyn.Resource(mapping.Resource).Namespace(ns)
	}
	force := true
	if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: fieldManager, Force: &force}); err != nil {
		return err
	}
	if gvk.Kind == "CustomResourceDefinition" {
		return waitEstablished(ctx, ri, obj.GetName())
	}
	return nil
}

// waitEstablished waits until the API server serves a CRD's kind: a
// controller started before then fails with "no matches for kind".
func waitEstablished(ctx context.Context, ri dynamic.ResourceInterface, name string) error {
	for {
		crd, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s is not Established: %w", name, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// runWait waits for one condition of the cluster: the API server ready, or
// a node Ready.
func runWait(args []string) error {
	fs := flag.NewFlagSet("wait", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "the admin kubeconfig (required)")
	timeout := fs.Duration("timeout", 120*time.Second, "how long to wait")
	node := fs.String("node", "", "wait for this node to be Ready (default: wait for the API server's /readyz)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var last error
	for {
		if *node == "" {
			_, last = cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		} else {
			last = nodeReady(ctx, cs, *node)
		}
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %w", *timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func nodeReady(ctx context.Context, cs kubernetes.Interface, name string) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				return nil
			}
			return fmt.Errorf("node %s: %s: %s", name, c.Reason, c.Message)
		}
	}
	return fmt.Errorf("node %s reports no Ready condition yet", name)
}
