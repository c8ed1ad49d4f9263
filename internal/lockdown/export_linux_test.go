//go:build amd64 || arm64

package lockdown

// SetNoMountSetattr makes Apply take the path for kernels without
// mount_setattr (before 5.12), so the jail test covers it on any kernel.
func SetNoMountSetattr(v bool) { noMountSetattr = v }
