package tlsca

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Leaf lifetimes. Seven days: long enough that a sandbox's working set of
// hosts is minted once a week, short enough that a leaf (whose key lives
// only in the daemon's memory) is worthless soon after. A leaf is replaced
// once it has less than a day left, so none expires mid-connection for any
// connection shorter than that.
const (
	leafValidity    = 7 * 24 * time.Hour
	leafRenewBefore = 24 * time.Hour
)

// maxLeaves bounds the cache: the guest chooses the names (every SNI it
// sends to an inspected host), so without a bound it could grow the daemon
// without limit. 4096 covers any real working set; a cached leaf (key,
// DER and parsed certificate) holds about 4 KiB, so a full cache is ~16 MiB.
const maxLeaves = 4096

// leafCache holds minted leaves, least recently used evicted first.
type leafCache struct {
	mu     sync.Mutex               // guards the fields below
	byName map[string]*list.Element // of *leafEntry
	lru    list.List                // front: most recently used

	// onMint, when set (by tests), is called once per certificate minted.
	onMint func(name string)
}

// leafEntry is one name. Its own lock serializes minting so that many
// handshakes for a new name mint once, while the cache lock is held only
// for the map lookup and other names are never kept waiting for a mint.
type leafEntry struct {
	name string
	mint sync.Mutex // held while minting this name
	cert atomic.Pointer[tls.Certificate]
}

// Leaf returns a certificate for name, a DNS name or an IP literal, signed
// by the CA: from the cache, or minted now. The chain holds the leaf only:
// the guest has the CA in its trust store already, and sending it again
// would add half a kilobyte to every handshake for nothing. Leaf is safe
// for concurrent use; callers must not modify the result.
func (c *CA) Leaf(name string) (*tls.Certificate, error) {
	key, ip, err := normalizeName(name)
	if err != nil {
		return nil, err
	}
	e := c.leaves.entry(key)
	now := c.now()
	if cert := e.cert.Load(); cert != nil && c.fresh(cert, now) {
		return cert, nil
	}
	e.mint.Lock()
	defer e.mint.Unlock()
	if cert := e.cert.Load(); cert != nil && c.fresh(cert, now) {
		return cert, nil // minted by whoever held the lock before us
	}
	cert, err := c.mint(key, ip, now)
	if err != nil {
		return nil, err
	}
	e.cert.Store(cert)
	return cert, nil
}

func (c *CA) fresh(cert *tls.Certificate, now time.Time) bool {
	return now.Add(leafRenewBefore).Before(cert.Leaf.NotAfter)
}

// entry returns the cache entry for name, adding it (and evicting the least
// recently used beyond maxLeaves) when missing. An evicted entry that a
// handshake is still minting for is simply dropped with it.
func (lc *leafCache) entry(name string) *leafEntry {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.byName == nil {
		lc.byName = make(map[string]*list.Element)
	}
	if el, ok := lc.byName[name]; ok {
		lc.lru.MoveToFront(el)
		return el.Value.(*leafEntry)
	}
	e := &leafEntry{name: name}
	lc.byName[name] = lc.lru.PushFront(e)
	for lc.lru.Len() > maxLeaves {
		old := lc.lru.Back()
		lc.lru.Remove(old)
		delete(lc.byName, old.Value.(*leafEntry).name)
	}
	return e
}

func (c *CA) mint(name string, ip net.IP, now time.Time) (*tls.Certificate, error) {
	if c.leaves.onMint != nil {
		c.leaves.onMint(name)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key for %s: %w", name, err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(leafValidity)
	if c.cert.NotAfter.Before(notAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	// Clients match the SAN only; the CN is for people reading the
	// certificate, and X.509 caps it at 64 characters.
	if len(name) <= 64 {
		tmpl.Subject = pkix.Name{CommonName: name}
	}
	if ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, key.Public(), c.key)
	if err != nil {
		return nil, fmt.Errorf("minting certificate for %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate minted for %s: %w", name, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// ErrBadName is returned by Leaf for a name that is neither a host name nor
// an IP address. The guest chooses the name (its SNI), so Leaf checks it
// rather than let it into a certificate.
var ErrBadName = errors.New("not a host name or IP address")

// normalizeName returns the cache key for name (lower case, no trailing
// dot, IPv4-mapped IPv6 as IPv4) and, for an IP literal, the address.
func normalizeName(name string) (string, net.IP, error) {
	n := strings.ToLower(strings.TrimSuffix(name, "."))
	if s, ok := strings.CutPrefix(n, "["); ok {
		n, _ = strings.CutSuffix(s, "]")
	}
	// Only what could be an address is parsed as one: a failed ParseAddr
	// allocates its error, on every cached handshake for a host name.
	if mayBeIP(n) {
		if addr, err := netip.ParseAddr(n); err == nil {
			if addr.Zone() != "" {
				return "", nil, fmt.Errorf("minting certificate for %q: %w (an address with a zone)", name, ErrBadName)
			}
			addr = addr.Unmap()
			return addr.String(), net.IP(addr.AsSlice()), nil
		}
	}
	if !validHostname(n) {
		return "", nil, fmt.Errorf("minting certificate for %q: %w", name, ErrBadName)
	}
	return n, nil, nil
}

func mayBeIP(s string) bool {
	return strings.IndexByte(s, ':') >= 0 || (s != "" && '0' <= s[len(s)-1] && s[len(s)-1] <= '9')
}

// validHostname accepts what may appear in a DNS SAN for a host: labels of
// 1-63 letters, digits, '-' and '_' (common in real names, e.g. SRV-style
// hosts), 253 characters in all. No wildcards: the gate mints for the exact
// name the guest asked for.
func validHostname(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			switch b := label[i]; {
			case 'a' <= b && b <= 'z', '0' <= b && b <= '9', b == '-', b == '_':
			default:
				return false
			}
		}
	}
	return true
}
