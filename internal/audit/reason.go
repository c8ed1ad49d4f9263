package audit

import (
	"fmt"
	"strings"
	"time"
)

// Reason is a record's reason: why the gate decided as it did, in the
// words the audit has always written. The words are frozen: people read
// them and scripts have matched them, and TestRecordsGolden and the
// gate's golden test hold them byte for byte. A reason is one of the
// constants below, or made by one of the functions below from a fixed
// part (a constant) and its detail; only the text of an error the gate
// met (a dial that failed, a guest that closed) is free, through
// ReasonFor. Readers tell reasons apart with == and Is, never with their
// own copies of the words.
type Reason string

// Reasons with no detail.
const (
	// ReasonNoRule: no rule decided the destination (default deny).
	ReasonNoRule Reason = "no rule allows it"
	// ReasonBlocked: a block rule decided it; the record's rule and
	// layer say which.
	ReasonBlocked Reason = "blocked by rule"
	// ReasonPoolUnbound: the guest dialed a private pool address whose
	// name is no longer bound (its lookup expired).
	ReasonPoolUnbound Reason = "pool address with no name bound (expired lookup)"
	// ReasonConnect: the gate is not a proxy.
	ReasonConnect Reason = "CONNECT is not relayed through the gate"
	// ReasonHostMismatch: a plain HTTP request's Host is an address,
	// and not the one the guest dialed.
	ReasonHostMismatch Reason = "Host names another address than the one dialed"
	// ReasonSecretInClear: a plain HTTP request to a host a secret is
	// bound to.
	ReasonSecretInClear Reason = "secrets bound to this host are only sent over TLS"
	// ReasonTooManyRequests: an intercepted connection has as many
	// requests in flight as the gate carries at once.
	ReasonTooManyRequests Reason = "too many requests in flight"
	// ReasonWatcherDenied: a watcher answered a hold with deny or block.
	ReasonWatcherDenied Reason = "denied by a watcher"
	// ReasonWatcherHour: let through while a watcher's "allow everything
	// for an hour" lasts.
	ReasonWatcherHour Reason = "allowed: a watcher opened everything for an hour"
	// ReasonDNSElsewhere: a DNS datagram to anything but the gateway.
	ReasonDNSElsewhere Reason = "DNS to a resolver other than the gateway"
	// ReasonUDP: a UDP datagram, which the gate does not carry.
	ReasonUDP Reason = "UDP is not forwarded (QUIC falls back to TCP)"
	// ReasonHeld starts the reason of every hold refused without an
	// answer (HeldTimedOut, HeldOverflow, ReasonWatcherLeft).
	ReasonHeld Reason = "held for a watcher"
	// ReasonWatcherLeft: the hold's watchers left before answering.
	ReasonWatcherLeft = ReasonHeld + ", who left"
	// ReasonMCPNoRule: no tools or resources pattern of the MCP server
	// allows the call (default deny).
	ReasonMCPNoRule Reason = "no MCP rule allows it"
	// ReasonMCPBlocked: a "!" pattern refused the call; rule says which.
	ReasonMCPBlocked Reason = "blocked by MCP rule"
	// ReasonMCPMethod: a JSON-RPC method the gate does not let through
	// to MCP servers.
	ReasonMCPMethod Reason = "MCP method not let through"
	// ReasonMCPBatch: an allowed call refused with the batch it came in,
	// because another member of the batch was refused.
	ReasonMCPBatch Reason = "refused with its batch"
	// ReasonMCPMalformed: a body to an MCP server that is not JSON-RPC
	// the gate can decide on; nothing of it was sent.
	ReasonMCPMalformed Reason = "malformed MCP message"
	// ReasonMCPTooLarge: a message to an MCP server over the gate's bound.
	ReasonMCPTooLarge Reason = "MCP message too large"
)

// Fixed parts of the reasons that carry a detail; the functions below add
// it.
const (
	ReasonRefusedClass    Reason = "refused address class"           // RefusedClass
	ReasonBadHead         Reason = "bad request head"                // BadHead
	ReasonMalformedHello  Reason = "malformed ClientHello"           // MalformedHello
	ReasonUnrecorded      Reason = "the audit log cannot be written" // Unrecorded
	ReasonTooManyConns    Reason = "too many open connections"       // TooManyConnections
	ReasonNeedsInspection Reason = "needs TLS inspection"            // NeedsInspection
	ReasonWatcherAllowed  Reason = "allowed by a watcher"            // WatcherAllowed
	ReasonTLSTerminated   Reason = "TLS terminated by the gate"      // TLSTerminated
	ReasonGuestHandshake  Reason = "TLS handshake with the guest"    // GuestHandshake
	ReasonUpstream        Reason = "upstream"                        // Upstream
	ReasonUpstreamWrite   Reason = "upstream write"                  // UpstreamWrite
	ReasonWebSocket       Reason = "WebSocket"                       // WebSocketUnscrubbable
	// ReasonFronting: a request inside a terminated TLS connection names
	// another host than the connection's SNI (domain fronting).
	ReasonFronting Reason = "the request names another host than its TLS connection" // Fronting
)

// What a connection without a name lacked, the first part of NamelessToPool
// and NamelessNoAddressRule.
const (
	ReasonNoSNI       Reason = "no SNI"
	ReasonECH         Reason = "encrypted ClientHello"
	ReasonNoHost      Reason = "no Host header"
	ReasonHostAddress Reason = "address in Host"
)

// Is reports whether r is fixed, or a reason made from the fixed part
// fixed and a detail: RefusedClass("private").Is(ReasonRefusedClass).
func (r Reason) Is(fixed Reason) bool {
	return strings.HasPrefix(string(r), string(fixed))
}

// detail joins a fixed part and its detail the way the audit writes them.
func (r Reason) detail(d string) Reason { return r + ": " + Reason(d) }

// ReasonFor is the reason of a flow that failed with err: its text, as
// the audit has always written it (a dial's error, a guest that closed
// before a decision).
func ReasonFor(err error) Reason { return Reason(err.Error()) }

// RefusedClass: the destination is in a refused address class (the
// policy's Special: "private", "loopback", ...).
func RefusedClass(class string) Reason { return ReasonRefusedClass.detail(class) }

// BadHead: a plain HTTP request head that does not parse.
func BadHead(err error) Reason { return ReasonBadHead.detail(err.Error()) }

// MalformedHello: a ClientHello that does not parse.
func MalformedHello(err error) Reason { return ReasonMalformedHello.detail(err.Error()) }

// Unrecorded: the audit log fails (err), so nothing goes through.
func Unrecorded(err error) Reason {
	return ReasonUnrecorded + Reason(" ("+err.Error()+"): nothing goes through unrecorded")
}

// TooManyConnections: the guest has max connections open through the gate.
func TooManyConnections(max int) Reason {
	return ReasonTooManyConns.detail(fmt.Sprintf("the sandbox's limit is %d ([network] max_connections)", max))
}

// NeedsInspection: a secret or request rules need the host's requests read
// (why), and the gate has no CA to terminate TLS with.
func NeedsInspection(why string) Reason {
	return ReasonNeedsInspection + Reason(" ("+why+") but the gate has no CA")
}

// WatcherAllowed: a watcher's answer (a control.Answer* word) let a hold
// through.
func WatcherAllowed(answer string) Reason { return ReasonWatcherAllowed + Reason(" ("+answer+")") }

// HeldTimedOut: nobody answered a hold within timeout.
func HeldTimedOut(timeout time.Duration) Reason {
	return ReasonHeld + Reason(", no answer in "+timeout.String())
}

// HeldOverflow: a destination could not be held, since max already wait.
func HeldOverflow(max int) Reason {
	return ReasonHeld + Reason(fmt.Sprintf(", but %d destinations already wait", max))
}

// TLSTerminated: why the gate terminated an allowed TLS connection.
func TLSTerminated(why string) Reason { return ReasonTLSTerminated.detail(why) }

// GuestHandshake: the guest's TLS handshake with the gate failed.
func GuestHandshake(err error) Reason { return ReasonGuestHandshake.detail(err.Error()) }

// Upstream: the real host did not answer a request (msg says how).
func Upstream(msg string) Reason { return ReasonUpstream.detail(msg) }

// UpstreamWrite: what the gate had read from the guest could not be sent
// on.
func UpstreamWrite(err error) Reason { return ReasonUpstreamWrite.detail(err.Error()) }

// WebSocketUnscrubbable: the gate closed a WebSocket whose frame (why)
// it cannot scrub secrets from.
func WebSocketUnscrubbable(why string) Reason {
	return ReasonWebSocket.detail(why + ", which the gate cannot scrub secrets from; the connection was closed")
}

// Fronting: the request's Host (host) is not its connection's SNI (sni).
func Fronting(host, sni string) Reason {
	return ReasonFronting.detail(fmt.Sprintf("Host %q, SNI %q", host, sni))
}

// ReasonNotByName: a connection to the gate service that is neither TLS
// with an SNI nor HTTP with a Host, so it carries no name to decide by.
const ReasonNotByName Reason = "neither TLS nor HTTP: the gate service decides connections by SNI or Host"

// ReasonUnknownSource: the gate service refused a client whose address is
// no tenant's (UnknownSource).
const ReasonUnknownSource Reason = "source is no tenant's"

// UnknownSource is the gate service's refusal of a client at src.
func UnknownSource(src string) Reason { return ReasonUnknownSource.detail(src) }

// NamelessToGate is a nameless connection (no SNI, no Host) that reached
// the gate service's own address, where no address rule applies.
func NamelessToGate(what Reason) Reason { return what + " to the gate's own address" }

// NamelessToPool: a connection without a name (what it lacked) to a
// private pool address, which only a name can stand for.
func NamelessToPool(what Reason) Reason { return what + " to a pool address" }

// NamelessNoAddressRule: a connection without a name (what it lacked)
// that no address rule for addr allows.
func NamelessNoAddressRule(what Reason, addr string) Reason {
	return what + Reason(" and no address rule allows "+addr)
}

// The daemon's reverse forwards, the guest's way to the host's ports.

// ReasonReverseForward: a connection to a gateway port a reverse forward
// lists, carried to the host's port.
const ReasonReverseForward Reason = "reverse forward"

// NotReverseForward: a connection to a gateway port no reverse forward of
// sandbox lists.
func NotReverseForward(port uint16, sandbox string) Reason {
	return Reason(fmt.Sprintf("gateway port %d is not a reverse forward (open it with: moat forward add --reverse %s %d)", port, sandbox, port))
}

// ReverseForwardFailed: the host's port of a reverse forward did not
// answer (err).
func ReverseForwardFailed(err error) Reason {
	return ReasonReverseForward.detail("the host's port did not answer: " + err.Error())
}

// ReasonForward: a connection from the host through a host → guest port
// forward, carried to the guest's port.
const ReasonForward Reason = "port forward"

// ForwardFailed: the guest's port of a host → guest forward did not
// answer (err).
func ForwardFailed(err error) Reason {
	return ReasonForward.detail("the guest's port did not answer: " + err.Error())
}

// ReasonMCPLocal: a request to a host-local MCP server ([mcp.NAME] with
// an http://127.0.0.1:PORT URL) at the gateway's PORT, decided by the
// server's rules and carried to the host's loopback.
const ReasonMCPLocal Reason = "host-local MCP server"

// NotMCPLocalPath: a request on a host-local MCP server's gateway port
// outside the path the declaration names (paths).
func NotMCPLocalPath(paths string) Reason {
	return ReasonMCPLocal.detail("only " + paths + " is served on this port")
}

// MCPLocalFailed: the host-local MCP server did not answer (err).
func MCPLocalFailed(err string) Reason {
	return ReasonMCPLocal.detail("the host's port did not answer: " + err)
}

// DNS reasons: the query's type, and what became of it.

// DNSAnswered: a query of qtype answered by the host's resolver.
func DNSAnswered(qtype string) Reason { return Reason(qtype) }

// DNSPooled: a query of qtype for a denied name, answered from the private
// pool and never sent upstream.
func DNSPooled(qtype string) Reason {
	return Reason(qtype + ": answered from the private pool, not sent upstream")
}

// DNSFront: a query of qtype answered with the gate service's own
// address (gate.DNSServer.HandleAt); a denied name is never sent upstream.
func DNSFront(qtype string, allowed bool) Reason {
	if allowed {
		return Reason(qtype + ": resolved upstream, answered with the gate's own address")
	}
	return Reason(qtype + ": answered with the gate's own address, not sent upstream")
}

// DNSFailed: a query of qtype that failed or was refused (err says why).
func DNSFailed(qtype, err string) Reason { return Reason(qtype + ": " + err) }

// The log's own records.

// DeletedFile: a dropped record for a file rotation or the retention
// deleted (base, n records in it), why saying which.
func DeletedFile(base string, n int64, why string) Reason {
	return Reason(fmt.Sprintf("deleted %s (%d records) for the audit's %s", base, n, why))
}

// Unwritten: a dropped record for n records the disk refused (why).
func Unwritten(n int64, why string) Reason {
	return Reason(fmt.Sprintf("%d records could not be written: %s", n, why))
}

// QueueFull: a dropped record for n records the writer's queue had no room
// for.
func QueueFull(n int64) Reason { return Reason(fmt.Sprintf("audit queue full: %d records lost", n)) }

// BeyondTracked: the count of denials of more destinations than the max
// the audit counts one by one in an interval.
func BeyondTracked(max int) Reason {
	return Reason(fmt.Sprintf("denials of more destinations than the %d the audit counts one by one in an interval", max))
}
