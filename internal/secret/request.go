package secret

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// ErrRequired is matched by the error Request returns when a secret with
// require = true is bound to the host and the request does not carry its
// placeholder: the guest tried to use some other credential there.
var ErrRequired = errors.New("required secret missing from request")

// RequiredError names the secret that was required and the host; it is
// written so that it can be shown to the guest in the gate's refusal.
type RequiredError struct {
	Secret string
	Host   string
	Where  string // "the x-api-key header", "any header or the key query parameter"
}

func (e *RequiredError) Error() string {
	return fmt.Sprintf("secret %s is required for %s but the request does not carry its placeholder in %s; send $%s as the credential",
		e.Secret, e.Host, e.Where, e.Secret)
}

func (e *RequiredError) Is(target error) bool { return target == ErrRequired }

// Applied lists what Request swapped, one "NAME:where" entry per secret
// and place, sorted: "GH_TOKEN:header:authorization",
// "GH_TOKEN:basic:authorization" (inside Basic credentials),
// "MAPS_KEY:query:key". Names and places only, for the audit record's
// transforms.
type Applied []string

// credentialHeaders are the headers a client commonly sends a credential
// in. With require, those that carry no placeholder of a secret bound to
// the host are removed, so a token the guest brought cannot ride along
// beside the user's: the upstream might prefer it, and the guest could
// then act there as someone else (for instance push to an account it
// controls). The list cannot be complete, since a server may accept a
// credential in any header it likes; it covers the standard ones and
// the common API-key headers, and each secret's own header is added.
// Cookie is among them because a session cookie is a credential too;
// cookies are filtered one by one, so a cookie that carries a
// placeholder keeps its place.
var credentialHeaders = []string{
	"Authorization",
	"Proxy-Authorization",
	"Cookie",
	"X-Api-Key",
	"Api-Key",
	"X-Auth-Token",
	"X-Access-Token",
	"Private-Token",
	"X-Goog-Api-Key",
}

// Request swaps placeholders for values in a request the gate
// terminated, before it is sent upstream. host is the name the request
// is for (the SNI or Host, a port is ignored); h and u are the request's
// header and URL, changed in place.
//
// For each secret bound to host, its placeholder is replaced by its
// value in the configured header, or in every header value when none is
// configured (as a substring, so "Bearer <placeholder>" works), inside
// "Basic" credentials of Authorization and Proxy-Authorization (decoded,
// swapped, encoded again: git over HTTPS sends tokens that way), and in
// the configured query parameter. Placeholders of secrets not bound to
// host are left as they are. Bodies and paths are never changed.
//
// When a bound secret has require set and its placeholder is in none of
// its places, the request is refused: the error matches ErrRequired and
// h and u are unchanged. Otherwise, with require, credential headers
// that carry no bound placeholder are removed (see credentialHeaders).
//
// For a bound host Request also sets Accept-Encoding to identity: the
// response is scrubbed of values as bytes, which a compressed body
// would hide.
func (s *Set) Request(host string, h http.Header, u *url.URL) (Applied, error) {
	if s == nil || s.st == nil {
		return nil, nil
	}
	idx := s.st.bound(host)
	if len(idx) == 0 {
		return nil, nil
	}
	snap := s.st.snap.Load()
	defs := s.st.defs

	requireAny := false
	for _, i := range idx {
		d := &defs[i]
		if !d.require {
			continue
		}
		requireAny = true
		if !d.carried(h, u) {
			return nil, &RequiredError{Secret: d.name, Host: host, Where: d.places()}
		}
	}
	if requireAny {
		phs := make([]string, len(idx))
		names := slices.Clone(credentialHeaders)
		for k, i := range idx {
			phs[k] = defs[i].placeholder
			if defs[i].header != "" {
				names = append(names, defs[i].header)
			}
		}
		stripCredentials(h, names, phs)
	}

	var applied Applied
	for _, i := range idx {
		d := &defs[i]
		applied = d.swapHeaders(h, snap.values[i], applied)
		if d.query != "" && u != nil {
			if q, ok := swapQuery(u.RawQuery, d.query, d.placeholder, string(snap.values[i])); ok {
				u.RawQuery = q
				applied = append(applied, d.name+":query:"+d.query)
			}
		}
	}
	h.Set("Accept-Encoding", "identity")
	slices.Sort(applied)
	return slices.Compact(applied), nil
}

// places describes where d's placeholder is looked for, for errors.
func (d *def) places() string {
	w := "any header"
	if d.header != "" {
		w = "the " + strings.ToLower(d.header) + " header"
	}
	if d.query != "" {
		w += " or the " + d.query + " query parameter"
	}
	return w
}

// headerKeys is the header keys d is swapped in.
func (d *def) headerKeys(h http.Header) []string {
	if d.header != "" {
		return []string{d.header}
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// carried reports whether the request carries d's placeholder in one of
// d's places.
func (d *def) carried(h http.Header, u *url.URL) bool {
	for _, k := range d.headerKeys(h) {
		for _, v := range h[k] {
			if strings.Contains(v, d.placeholder) {
				return true
			}
			if _, ok := basicSwap(k, v, d.placeholder, ""); ok {
				return true
			}
		}
	}
	if d.query != "" && u != nil {
		_, ok := swapQuery(u.RawQuery, d.query, d.placeholder, d.placeholder)
		return ok
	}
	return false
}

func (d *def) swapHeaders(h http.Header, val value, applied Applied) Applied {
	for _, k := range d.headerKeys(h) {
		vs := h[k]
		for j, v := range vs {
			if strings.Contains(v, d.placeholder) {
				vs[j] = strings.ReplaceAll(v, d.placeholder, string(val))
				applied = append(applied, d.name+":header:"+strings.ToLower(k))
				continue
			}
			if nv, ok := basicSwap(k, v, d.placeholder, string(val)); ok {
				vs[j] = nv
				applied = append(applied, d.name+":basic:"+strings.ToLower(k))
			}
		}
	}
	return applied
}

// basicSwap decodes "Basic base64(user:pass)" in an Authorization or
// Proxy-Authorization value, replaces ph by val inside and encodes it
// again; ok is false when v is not such a value or lacks ph.
func basicSwap(key, v, ph, val string) (string, bool) {
	if key != "Authorization" && key != "Proxy-Authorization" {
		return "", false
	}
	scheme, cred, found := strings.Cut(strings.TrimSpace(v), " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil || !strings.Contains(string(raw), ph) {
		return "", false
	}
	return scheme + " " + base64.StdEncoding.EncodeToString([]byte(strings.ReplaceAll(string(raw), ph, val))), true
}

// swapQuery replaces ph by val in the values of param in the raw query,
// leaving every other byte of it as the client wrote it (re-encoding the
// whole query would reorder parameters and change their escaping, which
// breaks signed URLs). ok is false when no value of param holds ph.
func swapQuery(raw, param, ph, val string) (string, bool) {
	parts := strings.Split(raw, "&")
	found := false
	for i, p := range parts {
		k, v, _ := strings.Cut(p, "=")
		if key, err := url.QueryUnescape(k); err != nil || key != param {
			continue
		}
		dv, err := url.QueryUnescape(v)
		if err != nil || !strings.Contains(dv, ph) {
			continue
		}
		parts[i] = k + "=" + url.QueryEscape(strings.ReplaceAll(dv, ph, val))
		found = true
	}
	return strings.Join(parts, "&"), found
}

// stripCredentials removes the values of the credential headers names
// that carry none of the placeholders phs (in plain or in Basic
// credentials), and the cookies that carry none.
func stripCredentials(h http.Header, names, phs []string) {
	carries := func(k, v string) bool {
		for _, ph := range phs {
			if strings.Contains(v, ph) {
				return true
			}
			if _, ok := basicSwap(k, v, ph, ""); ok {
				return true
			}
		}
		return false
	}
	for _, k := range names {
		vs, ok := h[k]
		if !ok {
			continue
		}
		var keep []string
		for _, v := range vs {
			if k == "Cookie" {
				var cs []string
				for c := range strings.SplitSeq(v, ";") {
					if carries(k, c) {
						cs = append(cs, strings.TrimSpace(c))
					}
				}
				if len(cs) > 0 {
					keep = append(keep, strings.Join(cs, "; "))
				}
				continue
			}
			if carries(k, v) {
				keep = append(keep, v)
			}
		}
		if len(keep) == 0 {
			delete(h, k)
		} else {
			h[k] = keep
		}
	}
}
