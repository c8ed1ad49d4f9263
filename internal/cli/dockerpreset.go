package cli

import (
	"maps"
	"os"

	"moat.dev/moat/internal/dockerrt"
	"moat.dev/moat/internal/state"
)

// Presets on a Docker sandbox: the record carries them (usePreset's
// stopped path: a Docker sandbox has no daemon to tell), and each session
// hands them to moat-docker, which writes them into the gate's policy
// (dockerrt/preset.go). Their credentials are read here, from the
// environment of the moat command that starts the session, as a gVisor
// daemon reads them from its start's.

// dockerPresetValues adds to values the preset credentials that the
// host's environment has and the user's files do not define.
func dockerPresetValues(values map[string]string, presets, defined []string) {
	for _, s := range dockerrt.PresetSecrets(presets, defined) {
		if v, ok := os.LookupEnv(s.Env); ok && v != "" {
			values[s.Env] = v
		}
	}
}

// keepDockerPlaceholders stores in the record the placeholders the gate
// now has, so that later sessions (and withPresetEnv's aliases) carry
// them as a gVisor sandbox's do.
func keepDockerPlaceholders(dir string, rec *state.Record) error {
	ph, err := dockerrt.Placeholders(dir)
	if err != nil || maps.Equal(ph, rec.Placeholders) {
		return err
	}
	return state.Update(dir, func(r *state.Record) error { r.Placeholders = ph; return nil })
}

// withDockerPlaceholders adds to a session's environment the gate's
// placeholders it lacks: the first session after a preset was added gets
// its credential's placeholder, which the gate made during the start.
func withDockerPlaceholders(dir string, sessEnv map[string]string) map[string]string {
	ph, err := dockerrt.Placeholders(dir)
	if err != nil || len(ph) == 0 {
		return sessEnv
	}
	if sessEnv == nil {
		sessEnv = map[string]string{}
	}
	for k, v := range ph {
		if _, ok := sessEnv[k]; !ok {
			sessEnv[k] = v
		}
	}
	return sessEnv
}
