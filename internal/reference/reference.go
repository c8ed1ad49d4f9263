// Package reference writes moat's command reference (docs/commands) and man
// pages from the commands' own help, so that they cannot drift from what
// `--help` says.
//
// It lives outside internal/cli so that the moat binary does not link the
// Markdown and man page generators: the CLI runs the package
// initialisation of everything the binary links, whether or not a command
// uses it (a sandbox's processes run moat-sandbox, which does not link
// this package either).
package reference

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra/doc"

	"moat.dev/moat/internal/cli"
	"moat.dev/moat/internal/roles"
)

// Write writes the command reference into dir: one Markdown page
// per command, and with man set, man pages under dir/man1.
func Write(dir string, man bool) error {
	root := cli.ReferenceRoot()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing the command reference: %w", err)
	}
	if err := doc.GenMarkdownTree(root, dir); err != nil {
		return fmt.Errorf("writing the command reference: %w", err)
	}
	if !man {
		return nil
	}
	mdir := filepath.Join(dir, "man1")
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		return fmt.Errorf("writing the man pages: %w", err)
	}
	hdr := &doc.GenManHeader{Title: "MOAT", Section: "1", Source: "moat " + roles.Version, Manual: "moat manual"}
	if err := doc.GenManTree(root, hdr, mdir); err != nil {
		return fmt.Errorf("writing the man pages: %w", err)
	}
	return nil
}
