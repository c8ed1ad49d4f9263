package daemon

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"moat.dev/moat/internal/config"
	"moat.dev/moat/internal/preset"
)

// The daemon lives as long as the sandbox, and a process's initial
// environment stays readable in /proc/PID/environ for its whole life
// (unsetting a variable later does not change that page); every child it
// starts would inherit it too. So the CLI does not give the daemon its own
// environment, with whatever the user exported for other tools (another
// agent's key, a cloud token): the daemon gets only what Environ keeps by
// name. The host variables the sandbox reads later reach it on a pipe:
// the secrets' `env:` sources, the variables [env] entries name (for the
// hooks the daemon runs) and those package-mirror discovery reads. The CLI
// writes their values, as one JSON object, to the pipe whose fd
// MOAT_SECRETS_FD names; the daemon reads it once at start. A preset added
// later, and `moat secrets refresh`, hand over their values on the
// control socket the same way.

// SecretsFDEnv names the variable holding the pipe's fd number.
const SecretsFDEnv = "MOAT_SECRETS_FD"

// maxHandover bounds what the daemon reads from the pipe: values are at
// most 64 KiB each (secret.Resolve refuses more).
const maxHandover = 16 << 20

// SecretVars are the environment variables the sandbox's secrets are read
// from: the configuration's `env:` sources and the presets' credentials.
func SecretVars(secrets map[string]config.Secret, presets []string) []string {
	var out []string
	for _, s := range secrets {
		if v, ok := strings.CutPrefix(s.From, "env:"); ok {
			out = append(out, v)
		}
	}
	for _, name := range presets {
		if p, err := preset.Lookup(name); err == nil {
			for _, s := range p.Secrets {
				out = append(out, s.Env)
			}
		}
	}
	return out
}

// Environ is the daemon's whole environment, taken from environ (the
// starting CLI's) by name: PATH, the locale, the user's name, home and
// XDG directories (where moat's own directories are, and what a
// `command:` secret source or a package tool needs to find its
// configuration), moat's own MOAT_* variables, GOMAXPROCS (the daemon's
// processors, which a user may set: see procs.go), and SSH_AUTH_SOCK when
// the sandbox forwards the SSH agent. Nothing else, whatever it is called.
func Environ(environ []string, sshAgent bool) []string {
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if keptVar(k, sshAgent) {
			out = append(out, kv)
		}
	}
	return out
}

func keptVar(k string, sshAgent bool) bool {
	switch k {
	case "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "GOMAXPROCS",
		"XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR":
		return true
	case "SSH_AUTH_SOCK":
		return sshAgent
	case SecretsFDEnv, "MOAT_READY_FD":
		return false // the CLI sets its own
	}
	return strings.HasPrefix(k, "LC_") || strings.HasPrefix(k, "MOAT_")
}

// discoveryVars are the variables package-mirror discovery reads
// (policy.Discover) or that change what the tools it runs answer (npm
// config, go env). They may hold a mirror's credentials in a URL, so they
// are handed over rather than put in the daemon's environment.
var discoveryVars = []string{
	"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE",
	"GOPROXY", "GOSUMDB", "GOENV", "GOPATH", "GOROOT", "GOFLAGS", "CARGO_HOME",
	"npm_config_registry", "NPM_CONFIG_REGISTRY", "npm_config_userconfig", "NPM_CONFIG_USERCONFIG",
	"npm_config_globalconfig", "NPM_CONFIG_GLOBALCONFIG", "npm_config_prefix", "NPM_CONFIG_PREFIX",
}

// HandedVars are the variables whose values the CLI hands over at start:
// the secrets' (SecretVars), the ones the sandbox's [env] entries read
// (configVars) and discovery's.
func HandedVars(secretVars, configVars []string) []string {
	out := append(append([]string{}, secretVars...), configVars...)
	return append(out, discoveryVars...)
}

// SplitEnv takes the named variables out of environ and returns the rest
// and the values taken.
func SplitEnv(environ []string, names []string) (rest []string, values map[string]string) {
	take := map[string]bool{}
	for _, n := range names {
		take[n] = true
	}
	values = map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if take[k] {
			values[k] = v
			continue
		}
		rest = append(rest, kv)
	}
	return rest, values
}

// WriteHandover writes values to the daemon's pipe and closes it.
func WriteHandover(w io.WriteCloser, values map[string]string) error {
	err := json.NewEncoder(w).Encode(values)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadHandover reads the values the CLI handed over, if it did.
func ReadHandover() (map[string]string, error) {
	s := os.Getenv(SecretsFDEnv)
	if s == "" {
		return map[string]string{}, nil
	}
	fd, err := strconv.Atoi(s)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q is not a file descriptor", SecretsFDEnv, s)
	}
	f := os.NewFile(uintptr(fd), "secrets")
	defer f.Close()
	values := map[string]string{}
	if err := json.NewDecoder(io.LimitReader(f, maxHandover)).Decode(&values); err != nil {
		return nil, fmt.Errorf("reading the secrets handed over by the CLI: %w", err)
	}
	// Discovery reads its variables with os.Getenv and its tools inherit
	// the daemon's environment. Setenv changes the process's copy, never
	// the initial page /proc/PID/environ shows; the shim and runsc are
	// started with an environment of their own.
	for _, k := range discoveryVars {
		if v, ok := values[k]; ok {
			os.Setenv(k, v)
		}
	}
	return values, nil
}
