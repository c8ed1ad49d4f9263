// Package kubernetes holds no code: its directory is moat's Kubernetes
// manifests (the gate service as a DaemonSet and Service with its RBAC, and an example
// agent-sandbox SandboxTemplate whose pods reach nothing but the gate), and
// its test decodes them with the Kubernetes API's and agent-sandbox's own
// Go types and checks the fields the gate's security rests on. A manifest
// is only read by a cluster when it is applied; the test makes a typo or a
// broken cross-reference fail here instead. See docs/kubernetes.md.
package kubernetes
