package control

import (
	"context"
	"net/http"
)

// Preset endpoint (schema 1, fields only ever added):
//
//	POST /v1/presets   body PresetRequest; adds the preset's hosts (the preset
//	                   layer) and credentials to the running sandbox, records
//	                   the preset with the sandbox so every later start adds
//	                   them too, and answers 200 PresetAnswer; 400 for an
//	                   unknown preset.
//
// The request carries the values of the preset's credential variables
// that the calling CLI has in its environment: a sandbox started before
// the user exported ANTHROPIC_API_KEY gets it now, without a restart, and
// a rotated token replaces the old one. The socket is 0600 and the daemon
// holds values in memory only; neither side logs the body.

// PresetRequest is the body of POST /v1/presets.
type PresetRequest struct {
	Schema int               `json:"schema"`
	Name   string            `json:"name"`
	Env    map[string]string `json:"env,omitempty"` // credential variable → value, from the CLI's environment
}

// PresetAnswer is the answer of POST /v1/presets.
type PresetAnswer struct {
	Schema int `json:"schema"`
	// Placeholders are every secret's placeholder by name, the preset's
	// included: what a session's environment must carry.
	Placeholders map[string]string `json:"placeholders"`
}

// Preset adds a preset to the running sandbox.
func (c *Client) Preset(ctx context.Context, req PresetRequest) (*PresetAnswer, error) {
	req.Schema = Schema
	var a PresetAnswer
	if err := c.do(ctx, http.MethodPost, "/v1/presets", req, &a); err != nil {
		return nil, err
	}
	return &a, nil
}
