//go:build !linux || !(amd64 || arm64)

package lockdown

import (
	"fmt"
	"runtime"
)

// Apply fails closed where the jail cannot be built.
func Apply(c Config) error {
	if _, err := c.validate(); err != nil {
		return err
	}
	return fmt.Errorf("%w on %s/%s: it needs linux/amd64 or linux/arm64", ErrUnsupported, runtime.GOOS, runtime.GOARCH)
}

// Supported reports that Apply cannot work here.
func Supported() error {
	return fmt.Errorf("%w on %s/%s: it needs linux/amd64 or linux/arm64", ErrUnsupported, runtime.GOOS, runtime.GOARCH)
}
