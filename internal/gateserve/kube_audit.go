package gateserve

import (
	"context"
	"encoding/json"
	"io"

	"moat.dev/moat/internal/audit"
)

// FollowAudit writes every record of the audit log at path to w, one JSON
// object a line, from the start of its current file, then each new one
// until ctx ends: `moat-gate audit-follow`, the gate pod's "audit"
// container on Kubernetes. Its stdout is then the node's audit records
// and nothing else, so that `moat network audit` reads them as the pod's
// log through the API (pods/log, which RBAC grants per namespace) without
// node access, and a node's log collector ships them like any
// container's log. A container of its own rather than the gate's stdout:
// the API's log merges a container's stdout and stderr (the stream
// choice is an alpha feature), and the gate's stderr is its own log.
// Replaying from the start at each start means the newest container's
// log holds the whole current file.
func FollowAudit(ctx context.Context, path string, w io.Writer) error {
	enc := json.NewEncoder(w)
	var werr error
	err := audit.Follow(ctx, path, func(r audit.Record) {
		if werr == nil {
			werr = enc.Encode(r)
		}
	})
	if werr != nil {
		return werr
	}
	return err
}
