package dockerrt

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"moat.dev/moat/internal/guestspec"
)

// Options describe a sandbox's start: moat's request to `moat-docker up`,
// on its stdin (package doc). Field names are frozen; only added.
type Options struct {
	Schema int `json:"schema"`
	// Dir is the sandbox's state directory (docker.json, gate/, guest/).
	Dir string `json:"dir"`
	// Moat is the moat binary, which the workload runs as its init
	// (/.moat/moat __init).
	Moat string `json:"moat"`
	// Gate is the moat-gate binary, the gate container's image.
	Gate string `json:"gate"`
	// Workspace is bind-mounted at the same path.
	Workspace string `json:"workspace,omitempty"`
	// Guest is the guest configuration; Up fills in its address, its
	// nameserver and CA file.
	Guest *guestspec.Spec `json:"guest"`
	// Policy is the tenant's moat.toml-syntax files, lowest layer first
	// (the user's config, the project's moat.toml); missing ones skipped.
	Policy []string `json:"policy,omitempty"`
	// Upstream is the resolvers the gate asks; empty: the gate
	// container's own (Docker's, which forwards to the host's).
	Upstream []netip.AddrPort `json:"upstream,omitempty"`
	// EgressSubnet is the egress network's subnet; invalid: Docker's
	// choice. Tests set it to a documentation range that the gate does
	// not refuse, where they serve the positive control.
	EgressSubnet netip.Prefix `json:"egress_subnet,omitzero"`
	// Secrets are the values of the env: and command: secrets
	// (Policy.Pushed), read by moat on the host, which moat-docker pushes
	// over the gate's control socket once it serves and before the
	// workload runs. They travel on moat-docker's stdin only: never an
	// argument, an environment variable or a file.
	Secrets map[string]string `json:"secrets,omitempty"`
	// Presets are the presets the sandbox has used (`moat run claude`):
	// their hosts and blocks are the tenant's lowest policy file, and
	// their credentials that Secrets has values for are pushed secrets
	// (preset.go).
	Presets []string `json:"presets,omitempty"`
	// Warn receives what the user should know (a shared kernel, dropped
	// secrets): moat-docker's stderr, which moat passes on.
	Warn io.Writer `json:"-"`
}

// ReadPolicy reads the tenant's policy files that exist, lowest layer
// first, and merges them (PolicyFile); trust maps each [network] trust
// path to the gate's copy.
func ReadPolicy(paths []string, trust func(string) (string, error)) (*Policy, error) {
	files := map[string][]byte{}
	var order []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		files[p], order = b, append(order, p)
	}
	return PolicyFile(files, order, trust)
}

// WriteGateDir writes gate/ in the sandbox's state directory: the
// service's configuration and the tenant's policy, with the [network]
// trust files copied beside it (the gate sees nothing else of the host).
//
// It returns the directory and the gate container's binds: the directory
// and, read-only at their own paths, the files of file: secrets.
func WriteGateDir(r *Record, o Options) (string, []string, error) {
	dir := filepath.Join(o.Dir, "gate")
	if err := os.MkdirAll(filepath.Join(dir, "trust"), 0o755); err != nil {
		return "", nil, err
	}
	// Read again as service.uid on reload.
	os.Chmod(dir, 0o755)
	// The jailed service (service.uid) writes the placeholders again
	// after a reload (a preset's credential pushed at a later session),
	// through state/, which the service makes 0700 for root: searchable
	// only, its files keep their own modes (the CA's key is root's, 0600).
	if err := os.MkdirAll(filepath.Join(dir, "state", "placeholders"), 0o700); err != nil {
		return "", nil, err
	}
	os.Chmod(filepath.Join(dir, "state"), 0o711)
	n := 0
	trust := func(p string) (string, error) {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", fmt.Errorf("[network] trust: %w", err)
		}
		n++
		name := fmt.Sprintf("trust/%d.pem", n)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return "", err
		}
		return gateDir + "/" + name, nil
	}
	pol, err := ReadPolicy(o.Policy, trust)
	if err != nil {
		return "", nil, err
	}
	if len(pol.Dropped) > 0 && o.Warn != nil {
		fmt.Fprintf(o.Warn, "moat: sandbox %q on Docker: secrets %s are not handed to the gate: a file: source must be an absolute path; requests carry their placeholders unchanged\n",
			r.Name, strings.Join(pol.Dropped, ", "))
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.toml"), pol.TOML, 0o644); err != nil {
		return "", nil, err
	}
	presets, presetPushed, err := PresetFile(o.Presets, pol.Defined, func(n string) bool { _, ok := o.Secrets[n]; return ok })
	if err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "preset.toml"), presets, 0o644); err != nil {
		return "", nil, err
	}
	pushed := append(pol.PushedNames(), presetPushed...)
	slices.Sort(pushed)
	if err := os.WriteFile(filepath.Join(dir, "gate.toml"), GateConfig(r.Subnet, r.GateIP, r.WorkloadIP, o.Upstream, pushed), 0o644); err != nil {
		return "", nil, err
	}
	binds := []string{dir + ":" + gateDir}
	for _, f := range pol.SecretFiles {
		binds = append(binds, f+":"+f+":ro")
	}
	return dir, binds, nil
}

// Placeholders are the placeholders (never values) the gate wrote for the
// workload of the sandbox whose state directory is dir, by secret name;
// none before the gate first ran.
func Placeholders(dir string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "gate", "state", "placeholders", tenant+".env"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if k, v, ok := strings.Cut(l, "="); ok && k != "" && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out, nil
}

// WriteGuestDir completes guest/ (which holds the agent's host key) with
// the guest's configuration, the gate's CA and moat itself.
func WriteGuestDir(dir string, r *Record, o Options, ca []byte) error {
	g := *o.Guest
	// The secrets' placeholders, which the gate wrote for its tenant's
	// clients (never the values): every session's environment.
	ph, err := Placeholders(o.Dir)
	if err != nil {
		return err
	}
	g.Env = slices.Clone(g.Env)
	for _, k := range slices.Sorted(maps.Keys(ph)) {
		g.Env = append(g.Env, k+"="+ph[k])
	}
	g.Listen = netip.AddrPortFrom(r.WorkloadIP, 22).String()
	g.Nameserver = r.GateIP.String()
	g.CAFile = guestspec.CAFile
	b, err := json.Marshal(&g)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(guestspec.File)), b, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(guestspec.CAFile)), ca, 0o644); err != nil {
		return err
	}
	return copyBinary(o.Moat, filepath.Join(dir, filepath.Base(guestspec.Binary)))
}

// copyBinary puts moat in the guest directory: a hard link where it can,
// else a copy (a bind of the file over a read-only bind would need a
// mount point the runtime cannot create).
func copyBinary(src, dst string) error {
	os.Remove(dst)
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
