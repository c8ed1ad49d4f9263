package control

import (
	"context"
	"net/http"
)

// POST /v1/suspend: 200 SuspendAnswer once the guest is saved; the daemon
// then stops and exits, and clients wait for the daemon lock to be free
// and read the record (state "suspended"). The sessions attached are
// ended first. 409 when the sandbox is not running (yet); 500 when the
// checkpoint failed, in which case the sandbox keeps running.
//
// No client-side timeout but the caller's context: a checkpoint writes
// the guest's whole memory, which on a loaded host takes longer than the
// 10 s other calls get.

// SuspendAnswer is POST /v1/suspend's answer. Fields are only added.
type SuspendAnswer struct {
	Schema int `json:"schema"`
	// Sessions is how many attached sessions were ended.
	Sessions int `json:"sessions"`
	// ImageBytes is the checkpoint image's size on disk.
	ImageBytes int64 `json:"image_bytes"`
}

// Suspend asks the daemon to checkpoint the guest and stop.
func (c *Client) Suspend(ctx context.Context) (*SuspendAnswer, error) {
	long := *c
	hc := *c.http
	hc.Timeout = 0
	long.http = &hc
	var a SuspendAnswer
	if err := long.do(ctx, http.MethodPost, "/v1/suspend", struct {
		Schema int `json:"schema"`
	}{Schema}, &a); err != nil {
		return nil, err
	}
	return &a, nil
}
