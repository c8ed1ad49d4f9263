package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	kexec "k8s.io/client-go/util/exec"

	"moat.dev/moat/internal/kubert"
)

// execMain is `moat-kube exec`: the command runs in the claim's pod with
// moat-kube's own stdin, stdout and stderr, and the result goes to fd 3.
func execMain(ctx context.Context, args []string) int {
	res := os.NewFile(3, "result")
	code, err := execCmd(ctx, args)
	out := kubert.ExecResult{Schema: kubert.Schema, ExitCode: code}
	if err != nil {
		out.Error, out.Code = err.Error(), kubert.ExitCode(err)
	}
	if res == nil || json.NewEncoder(res).Encode(out) != nil {
		// No fd 3: run by hand. Say it where a person looks.
		if err != nil {
			fmt.Fprintln(os.Stderr, kubert.ErrorPrefix+err.Error())
			return kubert.ExitCode(err)
		}
	}
	if err != nil {
		return kubert.ExitCode(err)
	}
	return code
}

func execCmd(ctx context.Context, args []string) (int, error) {
	a, err := kubert.ParseExecArgs(args)
	if err != nil {
		return 0, err
	}
	c, err := connect(a.Record.Context)
	if err != nil {
		return 0, err
	}
	r := a.Record
	cl, err := c.ext.ExtensionsV1beta1().SandboxClaims(r.Namespace).Get(ctx, r.Claim, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && string(cl.UID) != r.ClaimUID) {
		return 0, kubert.Errorf(kubert.ErrNotFound, "SandboxClaim %s in namespace %s is gone (deleted, or expired by its lifecycle)", r.Claim, r.Namespace)
	}
	if err != nil {
		return 0, apiErr(err, "reading SandboxClaim "+r.Claim)
	}
	pod, err := c.podOf(ctx, r)
	if err != nil {
		return 0, err
	}
	if !podReady(pod) {
		return 0, fmt.Errorf("pod %s of SandboxClaim %s is %s, not Ready (%s)", pod.Name, r.Claim, pod.Status.Phase, containerStates(pod))
	}
	container := pod.Annotations["kubectl.kubernetes.io/default-container"]
	if container == "" {
		container = pod.Spec.Containers[0].Name
	}
	opts := &corev1.PodExecOptions{Container: container, Command: a.Argv, Stdin: true, Stdout: true, Stderr: !a.TTY, TTY: a.TTY}
	req := c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(r.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(opts, scheme.ParameterCodec)
	// WebSocket first (its v5 protocol carries the close of stdin, so a
	// command reading to EOF ends), SPDY for API servers older than 1.30.
	ws, err := remotecommand.NewWebSocketExecutor(c.rc, "GET", req.URL().String())
	if err != nil {
		return 0, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(c.rc, "POST", req.URL())
	if err != nil {
		return 0, err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool { return true })
	if err != nil {
		return 0, err
	}
	so := remotecommand.StreamOptions{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Tty: a.TTY}
	if a.TTY {
		restore, sizes, err := rawTerminal(ctx)
		if err != nil {
			return 0, err
		}
		defer restore()
		so.Stderr, so.TerminalSizeQueue = nil, sizes
	}
	err = ex.StreamWithContext(ctx, so)
	var ee kexec.ExitError
	if errors.As(err, &ee) && ee.Exited() {
		return ee.ExitStatus(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("running %q in pod %s: %w", a.Argv[0], pod.Name, err)
	}
	return 0, nil
}

// sizeQueue hands the terminal's size to the exec stream: first as it
// is, then at each SIGWINCH.
type sizeQueue struct {
	c chan remotecommand.TerminalSize
}

func (q sizeQueue) Next() *remotecommand.TerminalSize {
	s, ok := <-q.c
	if !ok {
		return nil
	}
	return &s
}

// rawTerminal puts stdin's terminal in raw mode (keys, Ctrl-C among
// them, go to the pod's terminal) and follows its size.
func rawTerminal(ctx context.Context) (func(), remotecommand.TerminalSizeQueue, error) {
	fd := int(os.Stdin.Fd())
	old, err := term.MakeRaw(fd)
	if err != nil {
		return nil, nil, fmt.Errorf("putting the terminal in raw mode: %w", err)
	}
	q := sizeQueue{c: make(chan remotecommand.TerminalSize, 1)}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(q.c)
		send := func() {
			w, h, err := term.GetSize(int(os.Stdout.Fd()))
			if err != nil {
				return
			}
			select {
			case q.c <- remotecommand.TerminalSize{Width: uint16(w), Height: uint16(h)}:
			case <-ctx.Done():
			}
		}
		send()
		for {
			select {
			case <-winch:
				send()
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		cancel()
		<-done
		term.Restore(fd, old)
	}, q, nil
}
