// Package dockerrt runs a sandbox as Docker containers, for hosts where
// moat's own gVisor sandbox is not wanted or not possible, with moat's gate
// still the only way out.
//
// Topology, per sandbox (names carry the sandbox's name; every object is
// labelled moat.sandbox=NAME so that Down finds what a crashed Up left):
//
//	moat-NAME-int     an --internal bridge, IPv6 off, on a /24 moat picks
//	                  (Subnet): .1 is the host's bridge, .2 the gate, .3
//	                  the workload. Fixed addresses, because the gate's
//	                  configuration names the workload as its tenant before
//	                  either container starts.
//	moat-NAME-egress  an ordinary bridge: the gate's way out.
//	moat-NAME-gate    `moat gate serve` (internal/gateserve) from a FROM
//	                  scratch image holding the moat binary, on both
//	                  networks; DNS, HTTP and HTTPS on its internal address.
//	moat-NAME-work    the workload image, on the internal network only,
//	                  with moat init (internal/guest) as PID 1 and the
//	                  guest agent on .3:22, which the host reaches over the
//	                  bridge. The guest's files are the gVisor sandbox's:
//	                  /.moat holds moat, guest.json, host_key and ca.pem.
//
// Docker 20.10 gives a container on an --internal network a default route
// to the bridge and an embedded DNS server at 127.0.0.11 that answers the
// network's container names. Neither is moat's answer, so once the
// workload runs, moat enters its network namespace from the host (the
// workload never gets NET_ADMIN) and deletes every route but the subnet's,
// and flushes the nat rules that send 127.0.0.11 to Docker's resolver
// (netns_linux.go). The host's bridge address is on the subnet, so the
// host's INPUT chain drops what the bridge brings that is not a reply to
// the host's own connection (the agent's answers).
//
// The record, docker.json in the sandbox's state directory (fields
// frozen; only added): schema 1, image (the reference as configured),
// image_id (the digest it resolved to when the sandbox was made; every
// start uses it, never the tag again), gate_image, runtime (runc or
// runsc), subnet, gate_ip, workload_ip, bridge (the internal bridge's
// interface name).
package dockerrt
