package control

import (
	"errors"
	"net/http"
)

// ErrStopping is the error of a GET /v1/ssh (503) that reached a daemon
// already stopping its sandbox (idle stop): the caller waits for the stop
// and starts the sandbox again.
const ErrStopping = "the sandbox is stopping"

// IsStopping reports whether err is a daemon's ErrStopping refusal.
func IsStopping(err error) bool {
	var he *HTTPError
	return errors.As(err, &he) && he.Status == http.StatusServiceUnavailable && he.Msg == ErrStopping
}
