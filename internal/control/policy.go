package control

import (
	"context"
	"net/http"
)

// Named policies' lists.
//
//	POST /v1/policies/reload   200 PolicyReload. The daemon reads the lists of its
//	                           named policies again from the cache and their files
//	                           (it does not fetch) and swaps its policy; `moat policy
//	                           refresh` calls it after fetching.

// PolicyReload is the answer to POST /v1/policies/reload: the named
// policies' warnings after the reload, as in Status.
type PolicyReload struct {
	Schema   int      `json:"schema"`
	Warnings []string `json:"warnings,omitempty"`
}

// ReloadPolicies asks the daemon to read its named policies' lists again.
func (c *Client) ReloadPolicies(ctx context.Context) (*PolicyReload, error) {
	var r PolicyReload
	if err := c.do(ctx, http.MethodPost, "/v1/policies/reload", nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
