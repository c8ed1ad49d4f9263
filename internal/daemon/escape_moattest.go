//go:build moattest

package daemon

import (
	"encoding/json"
	"io"
	"net/http"

	"moat.dev/moat/internal/control"
	"moat.dev/moat/internal/lockdown/escape"
)

// A test build's gate process tries to get out of its jail on request
// (POST /v1/test/escape with escape.Targets), from inside the real
// process, and answers what each attempt did: the end-to-end suite's
// proof that the jail holds where it is used. Release builds have no such
// route: the file is compiled only with -tags moattest.
func init() { testRoutes = append(testRoutes, escapeRoute) }

// EscapeResult is one attempt as the route reports it; Error "" is an
// attempt that succeeded.
type EscapeResult struct {
	Name  string `json:"name"`
	Error string `json:"error"`
}

func escapeRoute(mux *http.ServeMux, d *daemon) {
	mux.HandleFunc("POST /v1/test/escape", func(w http.ResponseWriter, r *http.Request) {
		var t escape.Targets
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&t); err != nil {
			writeJSON(w, http.StatusBadRequest, control.ErrorBody{Schema: control.Schema, Error: err.Error()})
			return
		}
		var out []EscapeResult
		for _, res := range escape.Attempts(t) {
			e := EscapeResult{Name: res.Name}
			if res.Err != nil {
				e.Error = res.Err.Error()
			}
			out = append(out, e)
		}
		writeJSON(w, http.StatusOK, out)
	})
}
