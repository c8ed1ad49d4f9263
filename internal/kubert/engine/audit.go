package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"moat.dev/moat/internal/audit"
	"moat.dev/moat/internal/kubert"
)

// auditRecords writes the claim's audit records to w, one JSON object a
// line, from the log of the "audit" container of the gate's pod on the
// claim's node: the container that replays the node's audit file to its
// stdout (moat-gate audit-follow). The pod's log is read through the API
// (pods/log in the gate's namespace, which RBAC grants), so nobody needs
// the node. Only the claim's records leave: kubert.Ours.
func auditRecords(ctx context.Context, req kubert.AuditRequest, w io.Writer) error {
	r := req.Record
	c, err := connect(r.Context)
	if err != nil {
		return err
	}
	node := r.Node
	if pod, err := c.podOf(ctx, r); err == nil {
		node = pod.Spec.NodeName
	}
	if node == "" {
		return kubert.Errorf(kubert.ErrNotFound, "the claim's node is not known (its pod is gone and none was recorded)")
	}
	gateNS := r.GateNamespace
	if gateNS == "" {
		gateNS = kubert.DefaultGateNamespace
	}
	pods, err := c.cs.CoreV1().Pods(gateNS).List(ctx, metav1.ListOptions{LabelSelector: kubert.GateLabel,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return apiErr(err, fmt.Sprintf("listing the gate's pods in namespace %s (reading the audit needs get and list on pods, and get on pods/log, there)", gateNS))
	}
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return kubert.Errorf(kubert.ErrNotFound, "no running gate pod on node %s in namespace %s (label %s); the node's audit file is /var/log/moat-gate/kubernetes.jsonl on the node itself",
			node, gateNS, kubert.GateLabel)
	}
	// The newest: its audit container replayed the node's whole file when
	// it started, so it holds what an older one does.
	sort.Slice(live, func(i, j int) bool { return live[i].CreationTimestamp.After(live[j].CreationTimestamp.Time) })
	gate := live[0]
	stream, err := c.cs.CoreV1().Pods(gateNS).GetLogs(gate.Name, &corev1.PodLogOptions{Container: kubert.AuditContainer, Follow: req.Follow}).Stream(ctx)
	if err != nil {
		return apiErr(err, fmt.Sprintf("reading the log of container %s of gate pod %s in namespace %s", kubert.AuditContainer, gate.Name, gateNS))
	}
	defer stream.Close()
	enc := json.NewEncoder(w)
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var rec audit.Record
		if json.Unmarshal(sc.Bytes(), &rec) != nil || !kubert.Ours(rec, r.ClaimUID) {
			continue
		}
		if err := enc.Encode(rec); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}
