package checkpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/cpuid"

	"moat.dev/moat/internal/state"
)

// runscVersionWait bounds `runsc --version`, which answers in tens of ms.
const runscVersionWait = 10 * time.Second

// Host is this host's manifest for moat at moatVersion and the runsc at
// runscPath. When known's runsc_id is the binary's now, its runsc_version
// is taken without running runsc (tens of ms off a resume); known may be
// nil.
func Host(moatVersion, runscPath string, known *Manifest) (Manifest, error) {
	m := Manifest{Schema: 1, MoatVersion: moatVersion, Arch: goruntime.GOARCH, Created: time.Now().UTC()}
	id, err := runscID(runscPath)
	if err != nil {
		return m, err
	}
	m.RunscID = id
	if known != nil && known.RunscID == id && known.RunscVersion != "" {
		m.RunscVersion = known.RunscVersion
	} else if m.RunscVersion, err = runscVersion(runscPath); err != nil {
		return m, err
	}
	m.CPUFeatures, m.CacheLine = hostCPU()
	return m, nil
}

// runscID identifies the runsc binary at path: the same id is the same
// file, unchanged.
func runscID(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("reading runsc's version: %w", err)
	}
	id := fmt.Sprintf("%d:%d", fi.Size(), fi.ModTime().UnixNano())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id = fmt.Sprintf("%d:%d:%s", st.Dev, st.Ino, id)
	}
	return id, nil
}

// runscVersion is the first line of `runsc --version`
// ("runsc version v0.0.0-…").
func runscVersion(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), runscVersionWait)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("reading runsc's version: %s --version: %w", path, err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if line == "" {
		return "", fmt.Errorf("reading runsc's version: %s --version printed nothing", path)
	}
	return line, nil
}

// hostCPU is the host's CPU features by gVisor's names, and its cache
// line: what runsc restore compares (cpuid.FeatureSet.CheckHostCompatible).
func hostCPU() ([]string, uint32) {
	cpuid.Initialize()
	fs := cpuid.HostFeatureSet()
	var names []string
	for _, f := range cpuid.AllFeatures() {
		if fs.HasFeature(f) {
			names = append(names, f.String())
		}
	}
	return names, cacheLine(fs)
}

// Write writes m as the manifest of the image in dir, 0600 and flushed.
func Write(dir string, m Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return state.WriteAtomic(filepath.Join(dir, ManifestName), append(b, '\n'), 0o600)
}
