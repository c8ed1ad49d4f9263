package control

import (
	"context"
	"net/http"
)

// Secrets endpoint (schema 1, fields only ever added):
//
//	POST /v1/secrets/refresh   body SecretsRefreshRequest; reads every secret of
//	                           the running sandbox again (env: from the request's
//	                           values, then those the sandbox started with; file:
//	                           and command: on the host) and swaps them in
//	                           together, keeping the placeholders; 200
//	                           SecretsRefreshAnswer. If any value cannot be read,
//	                           nothing changes: 409 with the error, which names
//	                           the secret and its source.
//
// As with presets, the request carries the values of the secrets' env:
// variables that the calling CLI has in its environment; the socket is
// 0600, the daemon keeps values in memory only, and neither side logs the
// body.

// SecretsRefreshRequest is the body of POST /v1/secrets/refresh.
type SecretsRefreshRequest struct {
	Schema int               `json:"schema"`
	Env    map[string]string `json:"env,omitempty"` // variable → value, from the CLI's environment
}

// SecretsRefreshAnswer is the answer of POST /v1/secrets/refresh.
type SecretsRefreshAnswer struct {
	Schema int `json:"schema"`
	// Refreshed names every secret read again, sorted; Changed those whose
	// value differs from the one before. Names only, never a value.
	Refreshed []string `json:"refreshed"`
	Changed   []string `json:"changed"`
}

// RefreshSecrets reads the running sandbox's secrets again.
func (c *Client) RefreshSecrets(ctx context.Context, req SecretsRefreshRequest) (*SecretsRefreshAnswer, error) {
	req.Schema = Schema
	var a SecretsRefreshAnswer
	if err := c.do(ctx, http.MethodPost, "/v1/secrets/refresh", req, &a); err != nil {
		return nil, err
	}
	return &a, nil
}
