package dockerrt

import (
	"slices"

	toml "github.com/pelletier/go-toml/v2"

	"moat.dev/moat/internal/preset"
)

// A Docker sandbox's presets (`moat run claude`) reach its gate as the
// tenant's lowest policy file, preset.toml: each preset's hosts and
// telemetry blocks, and each of its credentials whose variable is set on
// the host as an env: secret bound to its hosts, whose value moat reads
// and pushes like any env: secret. The same choice as a gVisor daemon's
// (internal/daemon's wanted): a credential is skipped when the host does
// not have it, and a secret of the same name in the user's or the
// project's files wins, hosts and all. Being the lowest file, a user's or
// project's block overrides a preset's allow, as the preset layer is
// meant to be overridden; the audit names the rule's file as its source.

// PresetSecrets are the credentials of presets that become the
// sandbox's secrets when the host has their variable: those whose name
// the user's and the project's files (defined) do not use.
func PresetSecrets(presets []string, defined []string) []preset.Secret {
	var out []preset.Secret
	for _, name := range presets {
		p, err := preset.Lookup(name)
		if err != nil {
			continue // a preset this moat no longer knows
		}
		for _, s := range p.Secrets {
			if slices.Contains(defined, s.Env) || slices.ContainsFunc(out, func(o preset.Secret) bool { return o.Env == s.Env }) {
				continue
			}
			out = append(out, s)
		}
	}
	return out
}

// PresetFile is preset.toml for presets: their hosts and blocks, and the
// secrets of PresetSecrets whose value moat has (has), as pushed env:
// secrets. It returns the file and the names of those secrets.
func PresetFile(presets []string, defined []string, has func(name string) bool) ([]byte, []string, error) {
	type sec struct {
		From  string   `toml:"from"`
		Hosts []string `toml:"hosts"`
	}
	doc := map[string]any{}
	var allow, block []string
	for _, name := range presets {
		p, err := preset.Lookup(name)
		if err != nil {
			continue
		}
		allow = append(allow, p.Hosts...)
		block = append(block, p.Block...)
	}
	if len(allow)+len(block) > 0 {
		nw := map[string]any{}
		if len(allow) > 0 {
			nw["allow"] = allow
		}
		if len(block) > 0 {
			nw["block"] = block
		}
		doc["network"] = nw
	}
	var pushed []string
	secs := map[string]any{}
	for _, s := range PresetSecrets(presets, defined) {
		if !has(s.Env) {
			continue
		}
		secs[s.Env] = sec{From: "env:" + s.Env, Hosts: s.Hosts}
		pushed = append(pushed, s.Env)
	}
	if len(secs) > 0 {
		doc["secrets"] = secs
	}
	b, err := toml.Marshal(doc)
	if err != nil {
		return nil, nil, err
	}
	slices.Sort(pushed)
	return append([]byte("# Written by moat: the sandbox's presets, at each session.\n"), b...), pushed, nil
}
