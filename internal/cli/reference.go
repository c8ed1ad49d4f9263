package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra/doc"
)

// WriteReference writes the command reference into dir, generated from the
// commands' own help so that it cannot drift from what `--help` says: one
// Markdown page per command, and with man set, man pages under dir/man1.
func WriteReference(dir string, man bool) error {
	root := newRoot()
	root.DisableAutoGenTag = true
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
	hdr := &doc.GenManHeader{Title: "MOAT", Section: "1", Source: "moat " + Version, Manual: "moat manual"}
	if err := doc.GenManTree(root, hdr, mdir); err != nil {
		return fmt.Errorf("writing the man pages: %w", err)
	}
	return nil
}
