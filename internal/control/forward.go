package control

import (
	"context"
	"net/http"
)

// Port forward endpoints (schema 1, fields only ever added):
//
//	GET  /v1/forwards   200 Forwards: every forward in force, the configuration's first
//	POST /v1/forwards   body ForwardChange; applies it live (a host → guest forward is
//	                    listening when this answers), persists it with the sandbox and
//	                    answers 200 Forwards; 400 for a bad spec, a port already
//	                    forwarded, a host port already in use, or a remove of a forward
//	                    from the configuration, naming it

// Forward directions, in Forward.Direction.
const (
	ToGuest = "to_guest" // the host listens, the guest's port answers (ssh -L)
	ToHost  = "to_host"  // the gateway listens for the guest, 127.0.0.1 on the host answers (ssh -R)
)

// Forward is one port forward in force.
type Forward struct {
	Direction string `json:"direction"` // ToGuest | ToHost
	// Listen is where connections are accepted: the host's address:port
	// for ToGuest, the gateway's (10.88.0.1:port, in the guest) for ToHost.
	Listen string `json:"listen"`
	// Target is where they go: "guest:PORT" for ToGuest, 127.0.0.1:PORT
	// on the host for ToHost.
	Target string `json:"target"`
	Host   uint16 `json:"host"`   // the host's port
	Guest  uint16 `json:"guest"`  // the guest's port (the gateway's for ToHost)
	Spec   string `json:"spec"`   // as written: "3000", "8080:80"
	Source string `json:"source"` // config | runtime
	// Status: "listening" or "error" (ToGuest), "open" (ToHost),
	// "stopped" while the sandbox does not run.
	Status string `json:"status"`
	Error  string `json:"error,omitempty"` // why a forward is not listening
}

// Forwards is GET /v1/forwards.
type Forwards struct {
	Schema   int       `json:"schema"`
	Forwards []Forward `json:"forwards"`
}

// ForwardChange is the body of POST /v1/forwards.
type ForwardChange struct {
	Schema  int    `json:"schema"`
	Op      string `json:"op"` // add | remove
	Reverse bool   `json:"reverse"`
	Spec    string `json:"spec"` // "PORT" or "HOST:GUEST"
	// Address is the host address a host → guest forward listens on;
	// empty: 127.0.0.1. Refused for reverse forwards.
	Address string `json:"address,omitempty"`
}

// Forwards asks for the forwards in force.
func (c *Client) Forwards(ctx context.Context) (*Forwards, error) {
	var f Forwards
	if err := c.do(ctx, http.MethodGet, "/v1/forwards", nil, &f); err != nil {
		return nil, err
	}
	return &f, nil
}

// ChangeForward adds or removes a runtime forward.
func (c *Client) ChangeForward(ctx context.Context, ch ForwardChange) (*Forwards, error) {
	ch.Schema = Schema
	var f Forwards
	if err := c.do(ctx, http.MethodPost, "/v1/forwards", ch, &f); err != nil {
		return nil, err
	}
	return &f, nil
}
