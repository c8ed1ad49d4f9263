package cli

import "github.com/spf13/cobra"

// ReferenceRoot is the command tree that internal/reference documents. The
// generator itself stays out of this package, and so out of the moat
// binary (see that package's doc).
func ReferenceRoot() *cobra.Command {
	root := newRoot()
	root.DisableAutoGenTag = true
	return root
}
