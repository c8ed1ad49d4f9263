package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certValidity is ten years: the cluster is for tests on one machine, and a
// certificate that expires under a long-lived test machine fails in a way
// nobody looks for.
const certValidity = 10 * 365 * 24 * time.Hour

// identity is one client or server certificate the cluster needs.
type identity struct {
	file   string   // base name of the .crt/.key pair under the PKI directory
	cn     string   // the user name the API server sees
	orgs   []string // the groups it sees
	server bool     // a serving certificate (with SANs) rather than a client one
}

// kubeconfigs maps each component's kubeconfig to the identity it uses.
// The names are what the Node and RBAC authorizers expect: a kubelet is
// system:node:NAME in system:nodes, the scheduler, controller manager and
// kube-proxy are the users that Kubernetes' bootstrap RBAC policy binds.
var kubeconfigs = map[string]string{
	"admin":                    "admin",
	"kube-controller-manager":  "kube-controller-manager",
	"kube-scheduler":           "kube-scheduler",
	"kubelet":                  "kubelet",
	"kube-proxy":               "kube-proxy",
	"agent-sandbox-controller": "agent-sandbox-controller",
}

func identities(node string) []identity {
	return []identity{
		{file: "apiserver", cn: "kube-apiserver", server: true},
		{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{file: "admin", cn: "moat-cluster-admin", orgs: []string{"system:masters"}},
		{file: "kube-controller-manager", cn: "system:kube-controller-manager"},
		{file: "kube-scheduler", cn: "system:kube-scheduler"},
		{file: "kubelet", cn: "system:node:" + node, orgs: []string{"system:nodes"}},
		{file: "kubelet-server", cn: node, server: true},
		{file: "kube-proxy", cn: "system:kube-proxy"},
		{file: "agent-sandbox-controller", cn: "agent-sandbox-controller"},
	}
}

// runPKI makes the cluster's CA, certificates, service-account key pair and
// kubeconfigs under -dir. A file that exists is kept, so running it again
// changes nothing and a running cluster keeps trusting what it has.
func runPKI(args []string) error {
	fs := flag.NewFlagSet("pki", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory for the keys, certificates and kubeconfigs (required)")
	nodeIP := fs.String("node-ip", "", "the node's address: the API server's and the kubelet's (required)")
	serviceIP := fs.String("service-ip", "10.96.0.1", "the kubernetes Service's clusterIP, which pods dial")
	node := fs.String("node", "moat-node", "the node's name")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ip := net.ParseIP(*nodeIP)
	svc := net.ParseIP(*serviceIP)
	if *dir == "" || ip == nil || svc == nil {
		return errors.New("pki: -dir, and -node-ip and -service-ip as IP addresses, are required")
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return fmt.Errorf("making %s: %w", *dir, err)
	}
	ca, caKey, err := loadOrMakeCA(*dir)
	if err != nil {
		return err
	}
	for _, id := range identities(*node) {
		if exists(filepath.Join(*dir, id.file+".crt")) {
			continue
		}
		var ips []net.IP
		var names []string
		if id.file == "apiserver" {
			ips = []net.IP{ip, svc, net.IPv4(127, 0, 0, 1)}
			names = []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc",
				"kubernetes.default.svc.cluster.local", "localhost"}
		} else if id.file == "kubelet-server" {
			ips = []net.IP{ip}
			names = []string{*node}
		}
		if err := makeCert(*dir, id, ips, names, ca, caKey); err != nil {
			return err
		}
	}
	if !exists(filepath.Join(*dir, "sa.key")) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("generating the service-account key: %w", err)
		}
		if err := writeKey(filepath.Join(*dir, "sa.key"), key); err != nil {
			return err
		}
		der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
		if err != nil {
			return fmt.Errorf("encoding the service-account public key: %w", err)
		}
		if err := writePEM(filepath.Join(*dir, "sa.pub"), "PUBLIC KEY", der, 0o644); err != nil {
			return err
		}
	}
	server := "https://" + net.JoinHostPort(ip.String(), "6443")
	for name, id := range kubeconfigs {
		if err := writeKubeconfig(*dir, name, id, server); err != nil {
			return err
		}
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func loadOrMakeCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crtPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if exists(crtPath) {
		crt, err := readCert(crtPath)
		if err != nil {
			return nil, nil, err
		}
		key, err := readKey(keyPath)
		if err != nil {
			return nil, nil, err
		}
		return crt, key, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "moat-cluster CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(certValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the CA: %w", err)
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, err
	}
	if err := writePEM(crtPath, "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	crt, err := x509.ParseCertificate(der)
	return crt, key, err
}

func makeCert(dir string, id identity, ips []net.IP, names []string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating the key of %s: %w", id.file, err)
	}
	usage := x509.ExtKeyUsageClientAuth
	if id.server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: id.cn, Organization: id.orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     names,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("signing the certificate of %s: %w", id.file, err)
	}
	if err := writeKey(filepath.Join(dir, id.file+".key"), key); err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, id.file+".crt"), "CERTIFICATE", der, 0o644)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return writeFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// writeFile writes through a temporary file so that a crash never leaves a
// half-written key that a later run would keep.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s: %w", tmp, err)
	}
	return nil
}

func readPEM(path, typ string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != typ {
		return nil, fmt.Errorf("%s holds no %s block; remove the cluster's state with: scripts/cluster.sh down --purge", path, typ)
	}
	return block.Bytes, nil
}

func readCert(path string) (*x509.Certificate, error) {
	der, err := readPEM(path, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func readKey(path string) (*ecdsa.PrivateKey, error) {
	der, err := readPEM(path, "EC PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	return x509.ParseECPrivateKey(der)
}

// writeKubeconfig embeds the certificates rather than naming their files,
// so a kubeconfig copied elsewhere (a test's temporary directory) still
// works. It is rewritten each time: it holds nothing that is not in the
// PKI directory already.
func writeKubeconfig(dir, name, id, server string) error {
	b64 := func(file string) (string, error) {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", file, err)
		}
		return base64.StdEncoding.EncodeToString(data), nil
	}
	ca, err := b64("ca.crt")
	if err != nil {
		return err
	}
	crt, err := b64(id + ".crt")
	if err != nil {
		return err
	}
	key, err := b64(id + ".key")
	if err != nil {
		return err
	}
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: moat-cluster
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: moat-cluster
  context:
    cluster: moat-cluster
    user: %s
current-context: moat-cluster
`, server, ca, id, crt, key, id)
	return writeFile(filepath.Join(dir, name+".kubeconfig"), []byte(text), 0o600)
}
