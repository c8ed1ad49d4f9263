// Command manpages writes moat's man pages (man1) and Markdown command
// reference, generated from the commands' own help, into the directory it
// is given; scripts/setup.sh runs it into bin/man.
package main

import (
	"fmt"
	"os"

	"moat.dev/moat/internal/reference"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: manpages DIR")
		os.Exit(2)
	}
	if err := reference.Write(os.Args[1], true); err != nil {
		fmt.Fprintln(os.Stderr, "manpages:", err)
		os.Exit(1)
	}
}
