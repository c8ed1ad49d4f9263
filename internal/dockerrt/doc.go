// Package dockerrt runs a sandbox as Docker containers, for hosts where
// moat's own gVisor sandbox is not wanted or not possible, with moat's gate
// still the only way out.
//
// It is in two parts, because moat must not link the Docker SDK (every
// moat process would pay its package init; docs/architecture.md, "Three
// binaries"). This package, without the SDK, is what moat imports: the
// record, the plan (subnet, names, the gate's configuration and policy),
// the start's directories, and Helper, which runs moat-docker.
// internal/dockerrt/engine holds the engine's side (the SDK, the
// containers, the workload's network namespace), and is linked only into
// moat-docker (cmd/moat-docker), which moat runs from its own directory.
//
// Topology, per sandbox (names carry the sandbox's name; every object is
// labelled moat.sandbox=NAME so that Down finds what a crashed Up left):
//
//	moat-NAME-int     an --internal bridge, IPv6 off, on a /24 moat picks
//	                  (Subnet): .1 is the host's bridge, .2 the gate, .3
//	                  the workload. Fixed addresses, because the gate's
//	                  configuration names the workload as its tenant before
//	                  either container starts. Docker assigns from the
//	                  lower half only (AssignRange); the upper half is the
//	                  gate's names range (NamesRange), so TCP to any port
//	                  is decided by name.
//	moat-NAME-egress  an ordinary bridge: the gate's way out.
//	moat-NAME-gate    `moat-gate serve` (internal/gateserve) from a FROM
//	                  scratch image holding the moat-gate binary, on both
//	                  networks; DNS, HTTP and HTTPS on its internal address;
//	                  its control socket in gate/control/ of the state
//	                  directory (ControlSocket), where moat-docker pushes
//	                  the values of env: and command: secrets once the
//	                  gate serves and before the workload starts, and
//	                  again at every session (PushSecrets).
//	moat-NAME-net     the network holder: `moat-docker hold` (it waits for
//	                  its stop signal) in the gate's image, moat-docker
//	                  bound in, on runc, no capability; on the internal
//	                  network only, at .3, with the guest's hostname. It
//	                  owns the namespace the workload joins.
//	moat-NAME-work    the workload image, in the holder's namespace
//	                  (container:moat-NAME-net), on runsc or runc
//	                  (Record.Runtime), with moat init (internal/guest) as
//	                  PID 1 and the guest agent on .3:22, which the host
//	                  reaches over the bridge. The guest's files are the
//	                  gVisor sandbox's: /.moat holds moat, guest.json,
//	                  host_key and ca.pem.
//
// Docker 20.10 gives a container on an --internal network a default route
// to the bridge and an embedded DNS server at 127.0.0.11 that answers the
// network's container names. Neither is moat's answer, so before the
// workload starts, moat enters the holder's network namespace from the
// host (neither container gets NET_ADMIN), deletes every route but the
// subnet's and the reverse link's, and flushes the nat rules that send
// 127.0.0.11 to Docker's resolver (engine/netns_linux.go). Before, not
// after: runsc copies the namespace's routes into gVisor's network when
// the workload starts, and never again. The host's bridge address is on the subnet, so the
// host's INPUT chain drops what the bridge brings that is not a reply to
// the host's own connection (the agent's answers).
//
// The record, docker.json in the sandbox's state directory (fields
// frozen; only added): schema 1, image (the reference as configured),
// image_id (the digest it resolved to when the sandbox was made; every
// start uses it, never the tag again), gate_image, runtime (runc or
// runsc), subnet, gate_ip, workload_ip, bridge (the internal bridge's
// interface name); and, in `moat-docker up`'s answer only, work_started
// (the workload container's last start, Docker's StartedAt), by which
// moat runs the on_up hooks once per start.
//
// The moat-docker protocol (Helper and engine.Main; frozen, since moat and
// moat-docker of different builds may meet: fields and commands are only
// added). One operation per run:
//
//	moat-docker info                    {"schema":1,"version":V,"api":A,"runsc":BOOL}
//	moat-docker prepare DIR NAME IMAGE  the record it wrote to DIR
//	moat-docker up                      the record, once the guest agent answers;
//	                                    stdin: Options as JSON, "schema" 1
//	                                    (with "secrets", the values moat read
//	                                    on the host: stdin is the only way
//	                                    they reach moat-docker, whose
//	                                    environment is DOCKER_* and the
//	                                    basics, never moat's)
//	moat-docker stop DIR                {"schema":1}
//	moat-docker down DIR                {"schema":1}
//	moat-docker hold                    the network holder's process: waits for
//	                                    SIGTERM (engine/sandbox.go)
//	moat-docker forward DIR PID         the sandbox's port forwards, held until
//	                                    PID (the workload's init, on the host)
//	                                    exits; started by up, detached, its
//	                                    output in docker-forward.log
//	                                    (forward.go)
//
// The result is one JSON object on stdout, on exit code 0. Every other
// line on stderr is for the user (warnings), and moat passes it on as it
// comes; the error, on failure, is the lines beginning "moat-docker: "
// (ErrorPrefix), one per line of its message. The exit code is the
// error's class (ExitCode): 3 the engine is not reachable or not the local
// rootful one (ErrUnreachable, ErrNotLocal), 4 the directory has no
// record (ErrNoRecord), 5 Docker has no such image (ErrNoImage), 1 or any
// other anything else (2 is Go's for a panic). SIGTERM or SIGINT cancels
// the operation; a start cancelled half-way removes what it made.
package dockerrt
