package agent

import (
	"syscall"

	"golang.org/x/crypto/ssh"
)

// signals maps the RFC 4254 §6.10 signal names to Linux numbers. Only the
// RFC's list is accepted, as OpenSSH does: a client asking for anything else
// gets a failure reply rather than a guess.
var signals = map[ssh.Signal]syscall.Signal{
	ssh.SIGABRT: syscall.SIGABRT,
	ssh.SIGALRM: syscall.SIGALRM,
	ssh.SIGFPE:  syscall.SIGFPE,
	ssh.SIGHUP:  syscall.SIGHUP,
	ssh.SIGILL:  syscall.SIGILL,
	ssh.SIGINT:  syscall.SIGINT,
	ssh.SIGKILL: syscall.SIGKILL,
	ssh.SIGPIPE: syscall.SIGPIPE,
	ssh.SIGQUIT: syscall.SIGQUIT,
	ssh.SIGSEGV: syscall.SIGSEGV,
	ssh.SIGTERM: syscall.SIGTERM,
	ssh.SIGUSR1: syscall.SIGUSR1,
	ssh.SIGUSR2: syscall.SIGUSR2,
}

// SignalNumber returns the signal an SSH signal name stands for. The client
// uses it to turn exit-signal into a 128+n exit code.
func SignalNumber(name ssh.Signal) (syscall.Signal, bool) {
	sig, ok := signals[name]
	return sig, ok
}

// SignalName returns the SSH name of sig, for exit-signal and for the client
// forwarding its own signals.
func SignalName(sig syscall.Signal) (ssh.Signal, bool) {
	for name, n := range signals {
		if n == sig {
			return name, true
		}
	}
	return "", false
}
