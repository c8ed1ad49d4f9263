package e2e

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// debianRef is the name scripts/debian-image.sh gives its image (the OCI layout's
// io.containerd.image.name annotation, which `moat image import` records as the image's ref).
const debianRef = "moat-test/debian:bookworm"

// TestDebianAptThroughGate is the one test that touches a real outside service: the Debian mirror
// this host's own apt uses. In a Debian image built by scripts/debian-image.sh, apt must install a
// package through the gate with the default policy (which discovers that mirror from the apt
// sources), and a name no rule allows must be refused at once.
//
// Opt-in by availability: it runs where the host can reach its configured mirror and skips, saying
// so, everywhere else.
func TestDebianAptThroughGate(t *testing.T) {
	script := filepath.Join(repoRoot(t), "scripts", "debian-image.sh")
	mirror := debianMirror(t, script)

	archive := buildDebianImage(t, script)
	if out := mustMoat(t, "/", "image", "import", archive); !strings.Contains(out, debianRef) {
		t.Fatalf("import printed %q, want the ref %s", out, debianRef)
	}
	dir := project(t, "debian-apt")
	if err := os.WriteFile(filepath.Join(dir, "moat.toml"), []byte("[sandbox]\nimage = \""+debianRef+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := mustMoat(t, dir, "run", "--", "cat", "/etc/debian_version"); !strings.HasPrefix(out, "12.") {
		t.Fatalf("/etc/debian_version is %q, want bookworm (12.x)", out)
	}

	// apt runs as root through sudo, exactly as an agent would type it. Generous bound: a cold
	// apt-get update fetches the whole bookworm main index.
	install := "sudo apt-get update && sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl"
	start := time.Now()
	if r := moatWithin(t, dir, 10*time.Minute, "run", "--", "sh", "-c", install); r.code != 0 {
		t.Fatalf("apt through the gate failed (mirror %s): exit %d\nstdout: %s\nstderr: %s", mirror, r.code, tail(r.stdout, 40), tail(r.stderr, 40))
	}
	t.Logf("apt-get update and install curl through the gate: %v", time.Since(start).Round(time.Second))
	if out := mustMoat(t, dir, "run", "--", "sh", "-c", "command -v curl"); strings.TrimSpace(out) != "/usr/bin/curl" {
		t.Fatalf("command -v curl after install: %q", out)
	}

	// A name under no rule of the default policy. .test is reserved (RFC 2606): whatever the gate
	// does with it, no real host can answer.
	const denied = "not-in-policy.moat-e2e.test"
	for _, url := range []string{"https://" + denied + "/", "http://" + denied + "/"} {
		start := time.Now()
		r := moat(t, dir, nil, "run", "--", "curl", "-sS", "--max-time", "30", "-o", "/dev/null", "-w", "%{http_code}", url)
		took := time.Since(start)
		t.Logf("curl %s: exit %d, status %q in %v: %s", url, r.code, r.stdout, took.Round(time.Millisecond), strings.TrimSpace(r.stderr))
		// A denial is immediate: a refused connection, a reset, a TLS alert, or the gate's 403
		// for plain HTTP. Running into curl's own 30 s timeout would mean the gate swallowed
		// the connection.
		if took > 10*time.Second {
			t.Errorf("curl %s took %v: the denial was not prompt\nstderr: %s", url, took.Round(time.Millisecond), r.stderr)
		}
		refused := r.code != 0 && mentionsAny(r.stderr, "Failed to connect", "Connection refused", "Connection reset", "SSL_connect", "SSL_ERROR_SYSCALL", "alert access denied", "Empty reply", "Recv failure")
		forbidden := strings.TrimSpace(r.stdout) == "403"
		if !refused && !forbidden {
			t.Errorf("curl %s was not denied: exit %d, status %q\nstderr: %s", url, r.code, r.stdout, r.stderr)
		}
		// Over HTTPS the gate answers with its 403 page too, from the sandbox CA the Debian
		// image's store now trusts (init installed it); any other success is a leak.
		if strings.HasPrefix(url, "https:") && r.code == 0 && !forbidden {
			t.Errorf("curl %s succeeded; a TLS connection to a name no rule allows must fail or get the gate's 403", url)
		}
	}

	mustMoat(t, dir, "destroy", "--yes")
}

// repoRoot is two levels up from this package (test/e2e).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// debianMirror asks the build script which mirror the host's apt uses (one parser, not two) and
// skips unless the host can fetch its bookworm Release file within 5 s.
func debianMirror(t *testing.T, script string) string {
	t.Helper()
	out, err := exec.Command(script, "--print-mirror").Output()
	mirror := strings.TrimSpace(string(out))
	if err != nil || mirror == "" {
		t.Skipf("skipped: the host's apt configuration names no Debian bookworm main mirror (%v); "+
			"this test runs on a Debian 12 host whose /etc/apt sources have one and can reach it", err)
	}
	url := mirror + "/dists/bookworm/Release"
	if err := answers(url); err != nil {
		t.Skipf("skipped: the host cannot reach its apt mirror (HEAD %s: %v); "+
			"this test runs where the host's configured Debian mirror answers", url, err)
	}
	return mirror
}

// answers is nil when a HEAD of url from the host gets 200 within 5 s: the opt-in tests that
// reach a real outside service run only where it answers.
func answers(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// buildDebianImage runs the script, which returns at once when its cached image is current.
func buildDebianImage(t *testing.T, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, script)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/debian-image.sh: %v\n%s", err, tail(se.String(), 40))
	}
	t.Logf("debian image ready in %v", time.Since(start).Round(time.Millisecond))
	return strings.TrimSpace(so.String())
}

// moatWithin is moat with a longer bound than the helper's, for commands that download.
func moatWithin(t *testing.T, dir string, limit time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, moatBin, trusting(args)...)
	cmd.Dir = dir
	cmd.Env = moatEnv(nil)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("moat %v did not finish within %v\nstderr: %s", args, limit, tail(se.String(), 40))
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{so.String(), se.String(), code}
}

func mentionsAny(s string, words ...string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// tail keeps the last n lines: apt's output is long and the failure is at the end.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
