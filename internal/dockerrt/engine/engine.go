// Package engine is the Docker engine's side of runtime = "docker": the
// SDK client, a sandbox's containers and networks, and the workload's
// network namespace, edited from the host. It is linked only into
// moat-docker (cmd/moat-docker; Main), never into moat, whose every
// process would pay the SDK's package init; moat reaches it through
// dockerrt.Helper. The topology and the protocol are dockerrt's package
// doc.
package engine

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/system"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"moat.dev/moat/internal/dockerrt"
)

// Conn is a connection to the Docker engine of $DOCKER_HOST (default:
// /var/run/docker.sock).
type Conn struct {
	c *client.Client
}

// pingTimeout bounds the first request: a socket nobody answers on
// should not make the user wait.
const pingTimeout = 5 * time.Second

// Connect opens a client and checks that the engine answers. The API
// version is negotiated down to the engine's: Debian 12's Docker 20.10
// speaks 1.41, older than this client's default.
func Connect(ctx context.Context) (*Conn, error) {
	c, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", dockerrt.ErrUnreachable, err)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if _, err := c.Ping(pctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w at %s: %v; start it (e.g. systemctl start docker) or set DOCKER_HOST", dockerrt.ErrUnreachable, c.DaemonHost(), err)
	}
	c.NegotiateAPIVersion(ctx)
	return &Conn{c: c}, nil
}

// Close closes the connection.
func (e *Conn) Close() error { return e.c.Close() }

// Version is the engine's version and API version.
func (e *Conn) Version(ctx context.Context) (string, string, error) {
	v, err := e.c.ServerVersion(ctx)
	if err != nil {
		return "", "", err
	}
	return v.Version, v.APIVersion, nil
}

// CheckLocal refuses an engine that is not this host's rootful one. It
// returns what the engine said of itself, so that the caller asks its
// other questions of that rather than ask the engine again.
func (e *Conn) CheckLocal(ctx context.Context) (system.Info, error) {
	if h := e.c.DaemonHost(); !strings.HasPrefix(h, "unix://") {
		return system.Info{}, fmt.Errorf("%w: DOCKER_HOST is %s; moat removes the workload's routes and guards the bridge from this host, so it uses the engine on its unix socket", dockerrt.ErrNotLocal, h)
	}
	info, err := e.c.Info(ctx)
	if err != nil {
		return system.Info{}, fmt.Errorf("asking the Docker engine about itself: %w", err)
	}
	for _, o := range info.SecurityOptions {
		if strings.Contains(o, "name=rootless") {
			return system.Info{}, fmt.Errorf("%w: this engine is rootless; its networks live in a namespace of its own that moat does not guard", dockerrt.ErrNotLocal)
		}
	}
	return info, nil
}

// HasRuntime reports whether the engine has an OCI runtime registered
// under name ("runsc").
func (e *Conn) HasRuntime(ctx context.Context, name string) (bool, error) {
	info, err := e.c.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("asking the Docker engine for its runtimes: %w", err)
	}
	_, ok := info.Runtimes[name]
	return ok, nil
}

// runtimeKeepsWrites reports whether the engine's runtime name, as info
// registers it, keeps a container's writes in Docker's layer: true but
// for runsc registered without --overlay2=none, which keeps them in the
// sandbox, gone at its stop.
func runtimeKeepsWrites(info system.Info, name string) bool {
	if name != "runsc" {
		return true
	}
	for _, a := range info.Runtimes[name].Args {
		if a == "--overlay2=none" {
			return true
		}
	}
	return false
}

// ResolveImage returns the id (sha256:...) of a local image: the digest
// a sandbox records, so that a tag moved later does not change it.
func (e *Conn) ResolveImage(ctx context.Context, ref string) (string, error) {
	img, err := e.c.ImageInspect(ctx, ref)
	if err != nil {
		if client.IsErrNotFound(err) {
			return "", fmt.Errorf("%w: %q; import or build it first (docker import, docker build), moat pulls nothing on this runtime", dockerrt.ErrNoImage, ref)
		}
		return "", fmt.Errorf("inspecting image %q: %w", ref, err)
	}
	return img.ID, nil
}

// GateImage builds, once per moat-gate binary and CA bundle, the gate's
// image: FROM scratch, the (static) moat-gate binary as its entry point
// and the host's CA bundle, which the gate verifies upstreams with. No
// registry is involved. It returns the image's id.
//
// The image holds moat-gate, not moat: the gate service is a binary of its
// own (cmd/moat-gate), and the workload's moat (its init) comes from the
// sandbox's guest directory, bind-mounted, never from this image.
func (e *Conn) GateImage(ctx context.Context, gate, caBundle string) (string, error) {
	bin, err := os.ReadFile(gate)
	if err != nil {
		return "", fmt.Errorf("reading moat-gate for the gate's image (build it next to moat with: sudo scripts/setup.sh): %w", err)
	}
	// In /bin: /moat-gate is where the sandbox's gate/ is mounted.
	dockerfile := "FROM scratch\nCOPY moat-gate /bin/moat-gate\nCOPY tmp /tmp\n"
	ca, err := os.ReadFile(caBundle)
	if err == nil {
		dockerfile += "COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
	}
	dockerfile += "ENTRYPOINT [\"/bin/moat-gate\"]\n"
	// The tag is the sum of everything in the image, the Dockerfile
	// included: an image of another layout (an older moat's, whose entry
	// point was moat itself) is never taken for this one.
	h := sha256.New()
	for _, part := range [][]byte{[]byte(dockerfile), bin, ca} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	tag := "moat-gate:" + hex.EncodeToString(h.Sum(nil)[:8])
	if id, err := e.ResolveImage(ctx, tag); err == nil {
		return id, nil
	}
	var ctxTar bytes.Buffer
	tw := tar.NewWriter(&ctxTar)
	add := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	// /tmp: the jail (internal/lockdown) mounts its new root on an
	// empty directory of the old one.
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
		return "", err
	}
	if ca != nil {
		if err := add("ca-certificates.crt", 0o644, ca); err != nil {
			return "", err
		}
	}
	if err := add("moat-gate", 0o755, bin); err != nil {
		return "", err
	}
	if err := add("Dockerfile", 0o644, []byte(dockerfile)); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	resp, err := e.c.ImageBuild(ctx, &ctxTar, build.ImageBuildOptions{
		Tags: []string{tag}, Remove: true, ForceRemove: true,
		Labels: map[string]string{"moat.gate": "1"},
	})
	if err != nil {
		return "", fmt.Errorf("building the gate's image: %w", err)
	}
	defer resp.Body.Close()
	if err := buildError(resp.Body); err != nil {
		return "", fmt.Errorf("building the gate's image: %w", err)
	}
	id, err := e.ResolveImage(ctx, tag)
	if err != nil {
		return "", err
	}
	e.pruneGateImages(ctx, id)
	return id, nil
}

// pruneGateImages removes the gate images of earlier moat binaries, one
// per upgrade or rebuild otherwise, that no container uses: Docker
// refuses to remove one in use without force, which is not asked for.
func (e *Conn) pruneGateImages(ctx context.Context, keep string) {
	imgs, err := e.c.ImageList(ctx, image.ListOptions{Filters: filters.NewArgs(filters.Arg("label", "moat.gate=1"))})
	if err != nil {
		return
	}
	for _, img := range imgs {
		if img.ID != keep {
			e.c.ImageRemove(ctx, img.ID, image.RemoveOptions{PruneChildren: true})
		}
	}
}

// buildError reads a build's JSON message stream to its end and returns
// the first error it reports.
func buildError(r io.Reader) error {
	dec := json.NewDecoder(r)
	for {
		var m struct {
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&m); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
	}
}

// logs is the container's output since a time (zero: all of it), at
// most its last lines.
func (e *Conn) logs(ctx context.Context, id string, since time.Time, lines int) string {
	opts := container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: fmt.Sprint(lines)}
	if !since.IsZero() {
		// To the nanosecond: in whole seconds, a restart within the
		// second of the previous start would find that start's lines
		// (waitGate would take the old "serving" for the new one).
		opts.Since = fmt.Sprintf("%d.%09d", since.Unix(), since.Nanosecond())
	}
	rc, err := e.c.ContainerLogs(ctx, id, opts)
	if err != nil {
		return ""
	}
	defer rc.Close()
	var out, errb bytes.Buffer
	stdcopy.StdCopy(&out, &errb, io.LimitReader(rc, 1<<20))
	return out.String() + errb.String()
}

// usedSubnets are the IPv4 subnets of Docker's networks.
func (e *Conn) usedSubnets(ctx context.Context) ([]netip.Prefix, error) {
	nets, err := e.c.NetworkList(ctx, network.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Docker's networks: %w", err)
	}
	var out []netip.Prefix
	for _, n := range nets {
		for _, c := range n.IPAM.Config {
			if p, err := netip.ParsePrefix(c.Subnet); err == nil {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// remove deletes every container and network labelled with the
// sandbox's name: what Up made, or a crashed Up left.
func (e *Conn) remove(ctx context.Context, name string) error {
	f := filters.NewArgs(filters.Arg("label", dockerrt.Label+"="+name))
	cs, err := e.c.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return fmt.Errorf("listing the sandbox's containers: %w", err)
	}
	var errs []error
	for _, c := range cs {
		if err := e.c.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil && !client.IsErrNotFound(err) {
			errs = append(errs, fmt.Errorf("removing container %s: %w", c.Names, err))
		}
	}
	ns, err := e.c.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("listing the sandbox's networks: %w", err))...)
	}
	for _, n := range ns {
		if err := e.c.NetworkRemove(ctx, n.ID); err != nil && !client.IsErrNotFound(err) {
			errs = append(errs, fmt.Errorf("removing network %s: %w", n.Name, err))
		}
	}
	return errors.Join(errs...)
}

// exists reports whether there is a container called name.
func (e *Conn) exists(ctx context.Context, name string) (bool, error) {
	_, err := e.c.ContainerInspect(ctx, name)
	if client.IsErrNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// running reports whether the container called name runs, and its pid.
func (e *Conn) running(ctx context.Context, name string) (bool, int, error) {
	c, err := e.c.ContainerInspect(ctx, name)
	if client.IsErrNotFound(err) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, err
	}
	if c.State == nil || !c.State.Running {
		return false, 0, nil
	}
	return true, c.State.Pid, nil
}

// checkStatic refuses a binary that needs a dynamic loader: the network
// holder runs moat-docker in the gate's FROM scratch image, which has
// none, and would otherwise fail with a bare "no such file or directory".
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked, and the network holder runs it in an empty image; build it with CGO_ENABLED=0 (scripts/setup.sh does)", path)
		}
	}
	return nil
}
