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

// The values of `env:` secrets reach the daemon on a pipe, not in its
// environment: a process's initial environment stays readable in
// /proc/PID/environ for its whole life (unsetting a variable later does
// not change that page), and every child it starts would inherit it. So
// the CLI takes the secrets' variables out of the environment it gives the
// daemon and writes their values, as one JSON object, to the pipe whose fd
// MOAT_SECRETS_FD names; the daemon reads it once at start.

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
	return values, nil
}
