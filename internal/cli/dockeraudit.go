package cli

import (
	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/state"
)

// auditLogs is every audit log of the sandbox in dir, whose record is
// rec, that `moat network audit` and `moat network denials` read, merged
// by time (audit.ReadLogs, audit.FollowLogs); a time's tie goes to the
// first. A gVisor sandbox has one: its daemon's gate writes the forwards'
// records into it too. A Docker sandbox's are two, for two writers: its
// gate container's (auditPath) and its port forwarder's
// (dockerrt.ForwardAuditPath: each forwarded connection, both ways, and
// each refusal at the reverse forwards' address, which counts as a
// denial). Two files rather than one: the gate container cannot reach
// the forwarder's connections and the forwarder must not write into a
// log the gate container rotates. The forwarder's is missing until it
// carried or refused a connection, and on a sandbox from before it
// wrote one: no error.
func auditLogs(dir string, rec *state.Record) []string {
	if rec.Runtime == runtimeDocker {
		return []string{auditPath(dir, rec), dockerrt.ForwardAuditPath(dir)}
	}
	return []string{auditPath(dir, rec)}
}
