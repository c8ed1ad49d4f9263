package daemon

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
)

// guestTrust is the content of the guest's ca.pem: the sandbox CA's
// certificate first, then every certificate of the [network] trust files.
// The gate verifies the upstreams it terminates against those roots
// (upstreamRoots), but a host it splices is verified by the guest alone,
// which needs them too: init adds everything after the first certificate
// to the guest's trust stores, and Node reads the whole file
// (NODE_EXTRA_CA_CERTS). Only certificates go in, re-encoded: a trust file
// may hold comments, keys or CRLs, and the file is readable by the guest's
// agent user. A file with no certificate is an error that names it, as
// upstreamRoots reports it.
func guestTrust(caPEM []byte, files []string) ([]byte, error) {
	out := append([]byte(nil), caPEM...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("network.trust: reading %s: %w", f, err)
		}
		n := 0
		for block, rest := pem.Decode(b); block != nil; block, rest = pem.Decode(rest) {
			if block.Type != "CERTIFICATE" {
				continue
			}
			if _, err := x509.ParseCertificate(block.Bytes); err != nil {
				return nil, fmt.Errorf("network.trust: %s: parsing certificate %d: %w", f, n+1, err)
			}
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes})...)
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("network.trust: %s holds no PEM certificate; give a file of \"-----BEGIN CERTIFICATE-----\" blocks", f)
		}
	}
	return out, nil
}
