package image

import (
	"fmt"
	"strings"
)

// confinePath turns a tar entry name into a clean path relative to the layer root, or refuses it.
//
// Absolute names are made relative: layers built by old tools say "/etc/passwd" and mean the
// image's /etc/passwd. ".." is resolved lexically, and any ".." that would climb above the root
// refuses the entry: "/abs/../../x" is an escape attempt, not a typo. Lexical resolution is sound
// here only because the extractor never hands ".." or a symlink in a parent position to the
// kernel; it walks the returned components one openat at a time.
//
// The result is "" for the root itself, and otherwise never starts with '/', never holds "", "."
// or ".." components, and never holds a NUL.
func confinePath(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("path holds a NUL byte: %w", ErrUnsafeArchive)
	}
	parts := make([]string, 0, strings.Count(name, "/")+1)
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
		case "..":
			if len(parts) == 0 {
				return "", fmt.Errorf("path escapes the layer root: %w", ErrUnsafeArchive)
			}
			parts = parts[:len(parts)-1]
		default:
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "/"), nil
}
