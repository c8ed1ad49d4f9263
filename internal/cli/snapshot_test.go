package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moat.dev/moat/internal/checkpoint"
	"moat.dev/moat/internal/roles"
	"moat.dev/moat/internal/runtime"
	"moat.dev/moat/internal/state"
)

func TestValidTag(t *testing.T) {
	for _, tt := range []struct {
		tag string
		ok  bool
	}{
		{"before-migration", true},
		{"20261205-154900", true},
		{"v1.2_try", true},
		{"a", true},
		{strings.Repeat("a", 64), true},
		{strings.Repeat("a", 65), false},
		{"", false},
		{".hidden", false}, // the staging directory's form
		{"-flag", false},
		{"a/b", false},
		{"..", false},
		{"with space", false},
		{"naïve", false},
	} {
		err := validTag(tt.tag)
		if (err == nil) != tt.ok {
			t.Errorf("validTag(%q) = %v, want ok %v", tt.tag, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "TAG argument") {
			t.Errorf("validTag(%q)'s error %q does not name the argument", tt.tag, err)
		}
	}
}

func TestDefaultTag(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 12, 5, 15, 49, 0, 0, time.FixedZone("X", 3600))
	tag, err := defaultTag(dir, at)
	if err != nil || tag != "20261205-144900" {
		t.Fatalf("defaultTag = %q, %v; want the UTC time 20261205-144900", tag, err)
	}
	if err := validTag(tag); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(snapshotDir(dir, tag), 0o700)
	if tag, err := defaultTag(dir, at); err != nil || tag != "20261205-144900-2" {
		t.Fatalf("defaultTag with that one taken = %q, %v; want 20261205-144900-2", tag, err)
	}
}

// fakeRunsc is a runsc that prints version.
func fakeRunsc(t *testing.T, version string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho 'runsc version "+version+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckSnapshot: a snapshot of this host passes; one of another moat
// or gVisor is refused with what differs and what still works, and the
// sandbox and the snapshot are left as they were.
func TestCheckSnapshot(t *testing.T) {
	e := &env{runsc: fakeRunsc(t, "test-1")}
	here, err := checkpoint.Host(roles.MoatVersion(), e.runsc, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rec := &state.Record{Name: "api", State: state.StateStopped}
	edit := func(f func(m *checkpoint.Manifest)) checkpoint.Manifest { m := here; f(&m); return m }
	tests := []struct {
		name      string
		m         checkpoint.Manifest
		processes bool
		says      []string // "" none: passes
	}{
		{"this host", here, true, nil},
		{"another moat", edit(func(m *checkpoint.Manifest) { m.MoatVersion = "v0.9.0" }), true,
			[]string{"moat version: saved by v0.9.0", "Nothing was changed or deleted", "moat up api"}},
		{"another gVisor", edit(func(m *checkpoint.Manifest) { m.RunscVersion = "runsc version old"; m.RunscID = "" }), true,
			[]string{"saved by runsc version old, this is runsc version test-1"}},
		{"another gVisor, files only", edit(func(m *checkpoint.Manifest) { m.RunscVersion = "runsc version old"; m.RunscID = "" }), false, nil},
		{"a CPU feature missing", edit(func(m *checkpoint.Manifest) {
			m.CPUFeatures = append(m.CPUFeatures[:len(m.CPUFeatures):len(m.CPUFeatures)], "warp_drive")
		}), true,
			[]string{"lacks", "warp_drive"}},
		{"no manifest", checkpoint.Manifest{}, true, []string{"no manifest"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := e.checkSnapshot(dir, rec, &snapshotInfo{Tag: "t1", Processes: tt.processes, Manifest: tt.m})
			if tt.says == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("not refused")
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the refusal %q does not say %q", err, s)
				}
			}
		})
	}
}

// TestCheckSaved: a suspend's image is refused by another gVisor, kept,
// and not refused by another moat (the guest maps its own binary) nor
// without a manifest (a moat from before manifests).
func TestCheckSaved(t *testing.T) {
	e := &env{runsc: fakeRunsc(t, "test-1")}
	here, err := checkpoint.Host(roles.MoatVersion(), e.runsc, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		m       *checkpoint.Manifest
		corrupt bool
		refuse  bool
	}{
		{"this host", &here, false, false},
		{"another moat", func() *checkpoint.Manifest { m := here; m.MoatVersion = "v0.9.0"; return &m }(), false, false},
		{"another gVisor", func() *checkpoint.Manifest { m := here; m.RunscVersion, m.RunscID = "runsc version old", ""; return &m }(), false, true},
		{"no manifest", nil, false, false},
		{"a corrupt manifest", nil, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "api")
			if err := state.Create(dir, &state.Record{Name: "api", State: state.StateSuspended, StopReason: state.StopSuspend}); err != nil {
				t.Fatal(err)
			}
			img := runtime.SuspendDir(dir)
			os.Mkdir(img, 0o700)
			os.WriteFile(filepath.Join(img, "checkpoint.img"), []byte("image"), 0o600)
			if tt.m != nil {
				if err := checkpoint.Write(img, *tt.m); err != nil {
					t.Fatal(err)
				}
			}
			if tt.corrupt {
				os.WriteFile(filepath.Join(img, checkpoint.ManifestName), []byte("{trunc"), 0o600)
			}
			err := e.checkSaved(dir)
			if (err != nil) != tt.refuse {
				t.Fatalf("checkSaved = %v, want refused %v", err, tt.refuse)
			}
			if err != nil {
				for _, s := range []string{"Nothing was deleted", "moat down api && moat up api"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("the refusal %q does not say %q", err, s)
					}
				}
				var ee *exitError
				if !errors.As(err, &ee) {
					t.Errorf("the refusal has no exit code")
				}
			}
			if _, whole := runtime.ImageSize(dir); !whole {
				t.Error("the image is gone")
			}
		})
	}
}
