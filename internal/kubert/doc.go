// Package kubert runs a moat sandbox as an agent-sandbox claim on a
// Kubernetes cluster ([sandbox] runtime = "kubernetes", moat run
// --runtime kubernetes), behind moat's gate running there as a DaemonSet
// (docs/kubernetes.md).
//
// It is in two parts, as internal/dockerrt is, because moat must not link
// client-go (every moat process would pay its package init; see
// cmd/moat/deps_test.go). This package, without client-go, is what moat
// imports: the record of a claim, the request types, the filter that
// decides which audit records belong to a claim, and Helper, which runs
// moat-kube. internal/kubert/engine holds the API's side (client-go,
// agent-sandbox's clients, the exec stream) and is linked only into
// moat-kube (cmd/moat-kube), which moat runs from its own directory.
//
// The record, kube.json in the sandbox's state directory (fields frozen;
// only added): schema 1, context (the kubeconfig context, as resolved
// when the claim was made: the current one then, if none was named),
// namespace, template, pool (the SandboxWarmPool the claim
// names), gate_namespace, claim, claim_uid, sandbox, pod, node (the last
// three as they were when the claim was bound; exec and audit look them
// up again by claim_uid).
//
// The moat-kube protocol (Helper and engine.Main; frozen, since moat and
// moat-kube of different builds may meet: fields and commands are only
// added):
//
//	moat-kube claim    stdin: a ClaimRequest; stdout: the Record once the
//	                   claim is bound and its pod Ready.
//	moat-kube exec     args: ExecArgs; stdin, stdout and stderr are the
//	                   command's; fd 3 receives one ExecResult, the only
//	                   way the command's exit code and moat-kube's own
//	                   failure are told apart.
//	moat-kube release  stdin: a Record; deletes its claim (UID checked).
//	moat-kube audit    stdin: an AuditRequest; stdout: the claim's audit
//	                   records, one JSON object a line (internal/audit's
//	                   format), read from the gate's "audit" container log
//	                   on the claim's node; with follow, until stopped.
//
// Every command but exec reports a failure as lines on stderr that begin
// with ErrorPrefix and an exit code naming its class (ExitCode).
package kubert
