package guest

// ForkRequest is the SSH global request with which the daemon of a
// sandbox made by moat fork, connected with its parent's keys (the only
// ones the restored agent knows), asks the guest to take the fork's own
// identity: its host key and authorized key, its secret placeholders in
// sessions' environment, and its CA in the trust stores. Wire name:
// frozen.
const ForkRequest = "fork@moat.dev"
