package cluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The cluster has no registry: an image is one static binary in an
// otherwise empty root, written as an OCI archive and imported into the
// cluster's containerd, as scripts/cluster.sh does with its own
// (deploy/cluster/build/cmd/clustertool/image.go, a module of its own,
// which this copies).

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func ociArchive(name, at string, binary []byte) ([]byte, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(at, "/"), Mode: 0o755, Size: int64(len(binary)),
		Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(binary); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerDesc := blobDesc("application/vnd.oci.image.layer.v1.tar", layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": []string{at}, "Env": []string{"PATH=/"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return nil, err
	}
	configDesc := blobDesc("application/vnd.oci.image.config.v1+json", config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": configDesc, "layers": []descriptor{layerDesc},
	})
	if err != nil {
		return nil, err
	}
	manifestDesc := blobDesc("application/vnd.oci.image.manifest.v1+json", manifest)
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:],
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
		"manifests": []descriptor{manifestDesc}})
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	aw := tar.NewWriter(&out)
	for _, f := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(layerDesc), layer.Bytes()},
		{blobPath(configDesc), config},
		{blobPath(manifestDesc), manifest},
	} {
		if err := aw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := aw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := aw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func blobDesc(mediaType string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	return descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: len(data)}
}

func blobPath(d descriptor) string { return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:") }

// buildImage builds pkg (a main package of this module) statically and
// imports it into the cluster's containerd as an image named after its
// content, which it returns.
func buildImage(t *testing.T, repo, pkg string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
	cmd.Dir = moduleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	name := fmt.Sprintf("%s:%s", repo, hex.EncodeToString(sum[:6]))
	archive, err := ociArchive(name, "/"+filepath.Base(pkg), data)
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(dir, "image.tar")
	if err := os.WriteFile(tarPath, archive, 0o644); err != nil {
		t.Fatal(err)
	}
	ctr, sock := ctrCommand(t)
	out, err := exec.Command(ctr, "--address", sock, "-n", "k8s.io", "images", "import", tarPath).CombinedOutput()
	if err != nil {
		t.Fatalf("importing %s into the cluster's containerd: %v\n%s", name, err, out)
	}
	return name
}

// ctrCommand finds the ctr beside the containerd scripts/cluster.sh runs.
func ctrCommand(t *testing.T) (ctr, sock string) {
	t.Helper()
	// scripts/cluster.sh writes the path of each component's binary.
	b, err := os.ReadFile("/run/moat-cluster/containerd.exe")
	if err != nil {
		t.Fatalf("finding the cluster's containerd (%v): is scripts/cluster.sh up running?", err)
	}
	return filepath.Join(filepath.Dir(strings.TrimSpace(string(b))), "ctr"), "/run/moat-cluster/containerd/containerd.sock"
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}
