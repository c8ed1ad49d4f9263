package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

// runImage writes an OCI image archive, as `ctr images import` reads it, of
// one static binary in an otherwise empty root: the cluster has no registry,
// so every image its pods run is made here and imported.
func runImage(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	name := fs.String("name", "", "the image reference, e.g. moat.local/pause:1 (required)")
	bin := fs.String("binary", "", "the static binary to put in the image (required)")
	at := fs.String("path", "", "where the binary goes in the image (default: /NAME of the binary)")
	out := fs.String("o", "", "the archive to write (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" || *bin == "" || *out == "" {
		return errors.New("image: -name, -binary and -o are required")
	}
	if !strings.Contains(*name, ":") {
		return fmt.Errorf("image: -name %q has no tag; name it like moat.local/pause:1", *name)
	}
	if *at == "" {
		*at = "/" + path.Base(*bin)
	}
	data, err := os.ReadFile(*bin)
	if err != nil {
		return fmt.Errorf("reading the binary: %w", err)
	}
	archive, err := ociArchive(*name, *at, data)
	if err != nil {
		return err
	}
	return writeFile(*out, archive, 0o644)
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ociArchive builds the archive in memory: the binaries are a few MiB.
// Every timestamp is zero so the same binary always gives the same digest.
func ociArchive(name, at string, binary []byte) ([]byte, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(at, "/"), Mode: 0o755, Size: int64(len(binary)),
		Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	if _, err := tw.Write(binary); err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	layerDesc := blobDesc("application/vnd.oci.image.layer.v1.tar", layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": []string{at},
			"Env":        []string{"PATH=/"},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return nil, err
	}
	configDesc := blobDesc("application/vnd.oci.image.config.v1+json", config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
	})
	if err != nil {
		return nil, err
	}
	manifestDesc := blobDesc("application/vnd.oci.image.manifest.v1+json", manifest)
	// containerd names the imported image by io.containerd.image.name; the
	// OCI annotation carries the tag for other readers.
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:],
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []descriptor{manifestDesc},
	})
	if err != nil {
		return nil, err
	}

	var out bytes.Buffer
	aw := tar.NewWriter(&out)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(layerDesc), layer.Bytes()},
		{blobPath(configDesc), config},
		{blobPath(manifestDesc), manifest},
	}
	for _, f := range files {
		if err := addFile(aw, f.name, f.data); err != nil {
			return nil, fmt.Errorf("writing the archive: %w", err)
		}
	}
	if err := aw.Close(); err != nil {
		return nil, fmt.Errorf("writing the archive: %w", err)
	}
	return out.Bytes(), nil
}

func blobDesc(mediaType string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	return descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: len(data)}
}

func blobPath(d descriptor) string {
	return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:")
}

func addFile(tw *tar.Writer, name string, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)),
		Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	_, err := io.Copy(tw, bytes.NewReader(data))
	return err
}
