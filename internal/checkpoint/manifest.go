// Package checkpoint says whether a saved guest (a suspend's image, a named
// snapshot) can be restored on this host, and refuses it before runsc is
// asked when it cannot. runsc restore fails on a CPU without a feature the
// saved guest had, and an image of another gVisor is not a format runsc
// promises to read; failing there costs the user the image (the shim drops
// one runsc refused) and tells them little. So every image carries a
// manifest of what made it, compared with the host before the restore.
//
// The manifest is a JSON file, ManifestName, in the image's directory,
// written after runsc wrote the image. Its fields (names frozen; fields
// are only added):
//
//	schema         1
//	moat_version   moat's version (its build's revision for a dev build)
//	runsc_version  the first line of `runsc --version`
//	runsc_id       size and modification time of the runsc binary, so a
//	               check against the same binary need not run it
//	arch           GOARCH
//	cpu_features   the CPU features gVisor knows and the host has, by
//	               gVisor's names (its cpuid package: what runsc restore
//	               checks)
//	cache_line     the CPU's cache line in bytes (runsc restore refuses
//	               another)
//	created        when it was written (RFC 3339)
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ManifestName is the manifest's file name in an image's directory. On
// disk: frozen.
const ManifestName = "manifest.json"

// Manifest is what made a saved guest. Field names are frozen.
type Manifest struct {
	Schema       int       `json:"schema"`
	MoatVersion  string    `json:"moat_version"`
	RunscVersion string    `json:"runsc_version"`
	RunscID      string    `json:"runsc_id,omitempty"`
	Arch         string    `json:"arch"`
	CPUFeatures  []string  `json:"cpu_features"`
	CacheLine    uint32    `json:"cache_line,omitempty"`
	Created      time.Time `json:"created"`
}

// ErrNoManifest is Read's error for an image without a manifest.
var ErrNoManifest = errors.New("no manifest")

// Read reads the manifest of the image in dir: ErrNoManifest when it has
// none, an error naming the file when it is not one.
func Read(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", path, ErrNoManifest)
	}
	if err != nil {
		return nil, err
	}
	return Parse(path, b)
}

// Parse parses a manifest read from path (named in its errors).
func Parse(path string, b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s is not a checkpoint manifest: %v", path, err)
	}
	if m.Schema != 1 {
		return nil, fmt.Errorf("%s has schema %d; this moat reads schema 1", path, m.Schema)
	}
	if m.MoatVersion == "" || m.RunscVersion == "" || m.Arch == "" {
		return nil, fmt.Errorf("%s lacks moat_version, runsc_version or arch", path)
	}
	return &m, nil
}

// What is one thing a manifest records that can differ from the host.
type What string

const (
	MoatVersion  What = "moat version"
	RunscVersion What = "gVisor (runsc) version"
	Arch         What = "CPU architecture"
	CPUFeatures  What = "CPU features"
	CacheLine    What = "CPU cache line"
)

// Mismatch is one way the host differs from the one that saved a guest.
type Mismatch struct {
	What  What
	Saved string // as the manifest has it
	Now   string // this host's; for CPUFeatures, the features it lacks
}

func (m Mismatch) String() string {
	if m.What == CPUFeatures {
		return fmt.Sprintf("this CPU lacks features the saved guest's had: %s", m.Now)
	}
	return fmt.Sprintf("%s: saved by %s, this is %s", m.What, m.Saved, m.Now)
}

// Checks says which of a manifest's records matter for an image.
type Checks struct {
	// Moat: a snapshot holds moat's own state files (the writable layer's
	// layout, a fork's keys), which another moat may lay out otherwise. A
	// suspend's image does not need it: the restore maps the moat binary
	// the guest was saved with (runtime.GuestBinary), so an upgrade during
	// a suspend is safe.
	Moat bool
	// Guest: the guest's memory is restored (gVisor's version, the
	// architecture and the CPU's features); not for a snapshot of files
	// only.
	Guest bool
}

// Compare lists how now differs from saved, in the order of What, for
// the checks asked. CPU features saved that now lacks are a mismatch;
// features now has beyond saved are not (gVisor's own rule: the host's
// must be a superset).
func Compare(saved, now Manifest, c Checks) []Mismatch {
	var out []Mismatch
	if c.Moat && saved.MoatVersion != now.MoatVersion {
		out = append(out, Mismatch{MoatVersion, saved.MoatVersion, now.MoatVersion})
	}
	if !c.Guest {
		return out
	}
	if saved.RunscVersion != now.RunscVersion {
		out = append(out, Mismatch{RunscVersion, saved.RunscVersion, now.RunscVersion})
	}
	if saved.Arch != now.Arch {
		// The features of another architecture mean nothing here.
		return append(out, Mismatch{Arch, saved.Arch, now.Arch})
	}
	var lacking []string
	for _, f := range saved.CPUFeatures {
		if !slices.Contains(now.CPUFeatures, f) {
			lacking = append(lacking, f)
		}
	}
	if len(lacking) > 0 {
		out = append(out, Mismatch{What: CPUFeatures, Saved: strings.Join(saved.CPUFeatures, " "), Now: strings.Join(lacking, " ")})
	}
	if saved.CacheLine != 0 && now.CacheLine != 0 && saved.CacheLine != now.CacheLine {
		out = append(out, Mismatch{CacheLine, fmt.Sprintf("%d bytes", saved.CacheLine), fmt.Sprintf("%d bytes", now.CacheLine)})
	}
	return out
}

// Describe joins mismatches into one clause for an error message.
func Describe(ms []Mismatch) string {
	s := make([]string, len(ms))
	for i, m := range ms {
		s[i] = m.String()
	}
	return strings.Join(s, "; ")
}
