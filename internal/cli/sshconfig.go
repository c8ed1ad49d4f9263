package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"

	"moat.dev/moat/internal/keys"
	"moat.dev/moat/internal/state"
)

// Editors and OpenSSH reach a sandbox's agent the way moat's own CLI does:
// through the daemon's control socket (`moat ssh-proxy` as ProxyCommand),
// with the sandbox's client key, the agent's host key pinned. There is no
// listening port: nothing but the user who can read the state directory
// can connect.

func newSSHConfigCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ssh-config [NAME]",
		Short: "Print OpenSSH Host blocks for sandboxes, for ssh, scp, VS Code Remote-SSH and JetBrains Gateway",
		Long: `Prints a Host block for ~/.ssh/config: for NAME, else for the current
directory's sandbox, else for every sandbox:

  moat ssh-config >> ~/.ssh/config
  ssh moat-api                 # a shell in the sandbox
  scp notes.txt moat-api:      # sftp, into the workspace's user's home
  ssh -L 8080:localhost:3000 moat-api

The connection goes through the sandbox's daemon (ProxyCommand moat ssh-proxy),
which starts the sandbox if it is stopped. The host key is pinned in the
sandbox's state directory; the identity is the sandbox's own client key.`,
		Example: `  moat ssh-config >> ~/.ssh/config
  moat ssh-config api`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, err := newEnv()
			if err != nil {
				return err
			}
			var recs []*state.Record
			if len(args) == 1 {
				_, r, err := e.byName(args[0])
				if err != nil {
					return err
				}
				recs = append(recs, r)
			} else if ws, werr := cwd(); werr == nil {
				if _, r, err := e.forWorkspace(findWorkspace(ws)); err == nil && r != nil {
					recs = append(recs, r)
				}
			}
			if len(recs) == 0 {
				all, lerr := state.List(e.dirs)
				if lerr != nil {
					return lerr
				}
				recs = all
			}
			for _, r := range recs {
				if r.Runtime == runtimeKube { // no ssh into a claim's pod (kube.go)
					if len(args) == 1 {
						return kubeNotHere(r)
					}
					continue
				}
				if err := e.sshConfig(c.OutOrStdout(), r); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// sshConfig writes the sandbox's known_hosts and prints its Host block.
func (e *env) sshConfig(w io.Writer, r *state.Record) error {
	dir := e.dirs.Sandbox(r.Name)
	if err := keys.Ensure(dir); err != nil {
		return err
	}
	host, err := keys.HostPublic(dir)
	if err != nil {
		return err
	}
	alias := "moat-" + r.Name
	known := filepath.Join(dir, "known_hosts")
	line := alias + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(host))) + "\n"
	if err := state.WriteAtomic(known, []byte(line), 0o600); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	proxy := fmt.Sprintf("%s ssh-proxy %s", shellWord(exe), r.Name)
	if h := os.Getenv("MOAT_HOME"); h != "" {
		abs, _ := filepath.Abs(h)
		proxy = fmt.Sprintf("env MOAT_HOME=%s %s", shellWord(abs), proxy)
	}
	fmt.Fprintf(w, `Host %s
  HostName %s
  User agent
  ProxyCommand %s
  IdentityFile %s
  IdentitiesOnly yes
  HostKeyAlias %s
  UserKnownHostsFile %s
  StrictHostKeyChecking yes
  ServerAliveInterval 30

`, alias, alias, proxy, filepath.Join(dir, keys.ClientKey), alias, known)
	return nil
}

// shellWord quotes s for ProxyCommand, which OpenSSH runs with the shell.
func shellWord(s string) string {
	if !strings.ContainsAny(s, " \t'\"\\$`;&|<>()*?[]#~!{}") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func newSSHProxyCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "ssh-proxy NAME",
		Short:  "Connect stdin and stdout to a sandbox's SSH agent (OpenSSH's ProxyCommand)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			e, dir, _, err := sandboxNamed(args[0])
			if err != nil {
				return err
			}
			if _, err := e.startSession(dir, false); err != nil {
				return withCode(ExitRun, err)
			}
			conn, err := sandboxAt(dir).client().DialSSH(context.Background())
			if err != nil {
				return withCode(ExitRun, err)
			}
			defer conn.Close()
			go func() {
				io.Copy(conn, os.Stdin)
				if cw, ok := conn.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				}
			}()
			io.Copy(os.Stdout, conn)
			return nil
		},
	}
}
