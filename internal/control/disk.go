package control

// Disk is a sandbox's writable layer against its limit ([sandbox] disk),
// in Status and in `moat list --json` / `moat status --json`. Its JSON
// names are part of the control API: fields are only ever added.
type Disk struct {
	LimitBytes uint64 `json:"limit_bytes"` // the size of the sandbox's filesystem image
	UsedBytes  uint64 `json:"used_bytes"`  // what the guest's files take in it, as df counts
	// HostBytes is what the image takes on the host's filesystem (it is
	// sparse: only what the guest wrote, and less once it deletes).
	HostBytes uint64 `json:"host_bytes"`
}
