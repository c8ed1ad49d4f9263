package image

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// startRegistry serves an in-memory registry on loopback and returns its host:port.
func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestPull(t *testing.T) {
	host := startRegistry(t)
	ctx := context.Background()
	img := imageOf(t, layerOf(t, file("etc/os-release", "ID=pulled\n")), layerOf(t, file("app", "v1")))
	arm := imageOf(t, layerOf(t, file("app", "arm")))

	single := host + "/moat/single:1"
	if err := remote.Write(mustRef(t, single), img, remote.WithContext(ctx)); err != nil {
		t.Fatalf("pushing: %v", err)
	}
	multi := host + "/moat/multi:1"
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	if err := remote.WriteIndex(mustRef(t, multi), idx, remote.WithContext(ctx)); err != nil {
		t.Fatalf("pushing index: %v", err)
	}

	tests := []struct{ name, ref string }{
		{"single image", single},
		{"multi-platform index picks linux/amd64", multi},
		{"by digest", host + "/moat/single@" + digestOf(t, img)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t)
			var progress bytes.Buffer
			got, err := s.Pull(ctx, tt.ref, &progress)
			if err != nil {
				t.Fatalf("Pull(%s): %v", tt.ref, err)
			}
			if got.Ref != tt.ref || got.Digest != digestOf(t, img) {
				t.Errorf("Pull = %s %s, want %s %s", got.Ref, got.Digest, tt.ref, digestOf(t, img))
			}
			if b, err := os.ReadFile(filepath.Join(got.Layers[1], "app")); err != nil || string(b) != "v1" {
				t.Errorf("pulled app = %q, %v; want v1", b, err)
			}
			if !strings.Contains(progress.String(), "unpacking layer 1/2") {
				t.Errorf("no progress:\n%s", progress.String())
			}
			if r, err := s.Resolve(tt.ref); err != nil || r.Digest != got.Digest {
				t.Errorf("Resolve after pull = %v, %v", r, err)
			}
		})
	}
}

func TestPullMissing(t *testing.T) {
	host := startRegistry(t)
	s := openStore(t)
	if _, err := s.Pull(context.Background(), host+"/nope:1", nil); err == nil || !strings.Contains(err.Error(), "pulling ") {
		t.Fatalf("Pull of a missing image: err = %v, want a 'pulling' error", err)
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestIsLoopback(t *testing.T) {
	tests := []struct {
		registry string
		want     bool
	}{
		{"localhost:5000", true},
		{"LOCALHOST", true},
		{"127.0.0.1:5000", true},
		{"127.3.4.5", true},
		{"[::1]:5000", true},
		{"[::1]", true},
		{"index.docker.io", false},
		{"10.0.0.1:5000", false},
		{"192.168.1.2", false},
		{"localhost.evil.com", false},
		{"127.0.0.1.nip.io", false},
	}
	for _, tt := range tests {
		if got := isLoopback(tt.registry); got != tt.want {
			t.Errorf("isLoopback(%q) = %v, want %v", tt.registry, got, tt.want)
		}
	}
}
