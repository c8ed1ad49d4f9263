package guest

// sessionEnv is every session's base environment: the variables that make
// programs which ignore the system store trust the sandbox CA, then base
// (the spec's env), which comes later and so wins (the agent keeps the last
// value of a name): a user who sets one of these on purpose keeps it.
//
// caFile is the CA's path in the guest, empty when there is none. Node
// reads only its own bundled roots, plus NODE_EXTRA_CA_CERTS, which adds to
// them. Python's requests and pip read certifi's bundle unless told
// otherwise, and REQUESTS_CA_BUNDLE and PIP_CERT replace it: they point at
// the system bundle init completed (its roots plus the CA), and are left
// unset when there is none, because a file with the CA alone would make
// every host the gate splices untrusted. SSL_CERT_FILE is never set, for
// the same reason (docs/credentials.md).
func sessionEnv(base []string, caFile string, t trust) []string {
	var env []string
	if caFile != "" {
		env = append(env, "NODE_EXTRA_CA_CERTS="+caFile)
		if t.bundle != "" {
			env = append(env, "REQUESTS_CA_BUNDLE="+t.bundle, "PIP_CERT="+t.bundle)
		}
	}
	return append(env, base...)
}
