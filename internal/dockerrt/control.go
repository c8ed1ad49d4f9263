package dockerrt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"
)

// ControlSocket is, on the host, the gate's control socket for the
// sandbox whose state directory is dir (gateControl in the container).
func ControlSocket(dir string) string {
	return filepath.Join(dir, "gate", "control", "control.sock")
}

// pushTimeout bounds a push: the gate reloads with the values, which
// reads the tenant's policy files again.
const pushTimeout = 30 * time.Second

// PushSecrets hands the workload's secret values to its gate over the
// control socket (the client side of internal/gateserve's control API,
// PUT /v1/tenants/NAME/secrets; with no values, GET /v1/tenants), and
// returns the pushed secrets that still have no value. moat-docker does
// not link the gate service, so the few fields are spelled out here;
// TestPushSecrets checks them against the service.
func PushSecrets(ctx context.Context, sock string, values map[string]string) (pending []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}}
	var req *http.Request
	if len(values) == 0 {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, "http://gate/v1/tenants", nil)
	} else {
		body, merr := json.Marshal(map[string]any{"schema": 1, "values": values})
		if merr != nil {
			return nil, merr
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodPut, "http://gate/v1/tenants/"+tenant+"/secrets", bytes.NewReader(body))
	}
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reaching the gate's control socket %s: %w", sock, err)
	}
	defer resp.Body.Close()
	var out struct {
		Error   string   `json:"error"`
		Pending []string `json:"pending"`
		Tenants []struct {
			Name    string   `json:"name"`
			Pending []string `json:"pending"`
		} `json:"tenants"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return nil, fmt.Errorf("reading the gate's answer (HTTP %d): %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New(out.Error)
	}
	if len(values) > 0 {
		return out.Pending, nil
	}
	for _, t := range out.Tenants {
		if t.Name == tenant {
			return t.Pending, nil
		}
	}
	return nil, fmt.Errorf("the gate has no tenant %q", tenant)
}

// PendingError is a start stopped because secrets the gate needs did not
// reach it.
func PendingError(name string, pending []string) error {
	return fmt.Errorf("sandbox %q: the gate has no value for secrets %s (read on the host by moat and pushed to the gate); the start was stopped rather than let requests go without them",
		name, strings.Join(pending, ", "))
}

// Reload asks the gate to read its configuration and the tenant's policy
// files again (POST /v1/reload, as SIGHUP): all or nothing, the gate
// keeps its old configuration when it refuses the new one, and says why.
func Reload(ctx context.Context, sock string) error {
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gate/v1/reload", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("reaching the gate's control socket %s: %w", sock, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	var out struct {
		Error string `json:"error"`
	}
	json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out)
	return fmt.Errorf("the gate refused its new configuration (HTTP %d): %s", resp.StatusCode, out.Error)
}
