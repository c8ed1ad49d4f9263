package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestCompare(t *testing.T) {
	base := Manifest{Schema: 1, MoatVersion: "v1.2.0", RunscVersion: "runsc version release-1", Arch: "amd64",
		CPUFeatures: []string{"fpu", "sse2", "avx2", "avx512f"}, CacheLine: 64}
	with := func(f func(m *Manifest)) Manifest {
		m := base
		m.CPUFeatures = slices.Clone(base.CPUFeatures)
		f(&m)
		return m
	}
	all := Checks{Moat: true, Guest: true}
	tests := []struct {
		name string
		now  Manifest
		c    Checks
		want []What
		says []string // in Describe's text
	}{
		{"same host", base, all, nil, nil},
		{"more CPU features now", with(func(m *Manifest) { m.CPUFeatures = append(m.CPUFeatures, "amx_tile") }), all, nil, nil},
		{"features in another order", with(func(m *Manifest) { m.CPUFeatures = []string{"avx512f", "avx2", "sse2", "fpu"} }), all, nil, nil},
		{"moat differs", with(func(m *Manifest) { m.MoatVersion = "v1.3.0" }), all, []What{MoatVersion},
			[]string{"moat version: saved by v1.2.0, this is v1.3.0"}},
		{"moat differs, not checked (a suspend's image)", with(func(m *Manifest) { m.MoatVersion = "v1.3.0" }), Checks{Guest: true}, nil, nil},
		{"runsc differs", with(func(m *Manifest) { m.RunscVersion = "runsc version release-2" }), all, []What{RunscVersion},
			[]string{"saved by runsc version release-1, this is runsc version release-2"}},
		{"CPU lacks features", with(func(m *Manifest) { m.CPUFeatures = []string{"fpu", "sse2"} }), all, []What{CPUFeatures},
			[]string{"lacks", "avx2 avx512f"}},
		{"cache line differs", with(func(m *Manifest) { m.CacheLine = 128 }), all, []What{CacheLine}, []string{"64 bytes", "128 bytes"}},
		{"cache line unknown", with(func(m *Manifest) { m.CacheLine = 0 }), all, nil, nil},
		{"another architecture: features not compared", with(func(m *Manifest) { m.Arch = "arm64"; m.CPUFeatures = []string{"fp"} }), all, []What{Arch}, []string{"amd64", "arm64"}},
		{"files only: gVisor and CPU do not matter", with(func(m *Manifest) { m.RunscVersion = "x"; m.CPUFeatures = nil }), Checks{Moat: true}, nil, nil},
		{"everything differs", with(func(m *Manifest) {
			m.MoatVersion, m.RunscVersion, m.CPUFeatures, m.CacheLine = "v2", "runsc version 9", []string{"fpu"}, 32
		}), all, []What{MoatVersion, RunscVersion, CPUFeatures, CacheLine}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Compare(base, tt.now, tt.c)
			var whats []What
			for _, m := range got {
				whats = append(whats, m.What)
			}
			if !reflect.DeepEqual(whats, tt.want) {
				t.Fatalf("Compare = %v, want %v", got, tt.want)
			}
			text := Describe(got)
			for _, s := range tt.says {
				if !strings.Contains(text, s) {
					t.Errorf("Describe = %q, want it to say %q", text, s)
				}
			}
		})
	}
}

func TestRead(t *testing.T) {
	good := `{"schema":1,"moat_version":"v1","runsc_version":"runsc version x","arch":"amd64","cpu_features":["fpu"],"created":"2026-12-05T15:00:00Z"}`
	tests := []struct {
		name    string
		body    *string
		wantErr string // "" for none
		missing bool
	}{
		{name: "whole", body: &good},
		{name: "missing", wantErr: "no manifest", missing: true},
		{name: "truncated", body: ptr(good[:40]), wantErr: "is not a checkpoint manifest"},
		{name: "not JSON", body: ptr("\x00\x01garbage"), wantErr: "is not a checkpoint manifest"},
		{name: "another schema", body: ptr(`{"schema":2,"moat_version":"v1","runsc_version":"r","arch":"amd64"}`), wantErr: "schema 2"},
		{name: "no versions", body: ptr(`{"schema":1,"arch":"amd64"}`), wantErr: "lacks moat_version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.body != nil {
				if err := os.WriteFile(filepath.Join(dir, ManifestName), []byte(*tt.body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			m, err := Read(dir)
			if tt.wantErr == "" {
				if err != nil || m.MoatVersion != "v1" || len(m.CPUFeatures) != 1 {
					t.Fatalf("Read = %+v, %v", m, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Read error = %v, want one that says %q", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, ManifestName)) {
				t.Errorf("the error %q does not name the file", err)
			}
			if got := errors.Is(err, ErrNoManifest); got != tt.missing {
				t.Errorf("errors.Is(err, ErrNoManifest) = %v, want %v", got, tt.missing)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// TestFrozenNames: the manifest's field names are on disk in every image
// and snapshot.
func TestFrozenNames(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, Manifest{Schema: 1, MoatVersion: "v", RunscVersion: "r", RunscID: "i", Arch: "a", CPUFeatures: []string{"f"}, CacheLine: 64}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"schema"`, `"moat_version"`, `"runsc_version"`, `"runsc_id"`, `"arch"`, `"cpu_features"`, `"cache_line"`, `"created"`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("the manifest lacks %s:\n%s", k, b)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dir, "manifest.json")); fi.Mode().Perm() != 0o600 {
		t.Errorf("the manifest's mode is %v, want 0600", fi.Mode().Perm())
	}
}
