package egress

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"sync"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
)

// CA is a VM's own certificate authority, with which its proxy answers
// the guest's TLS for a host it intercepts (Interceptor). The guest trusts
// its certificate and nothing else of it; the key stays on the host (0600,
// like the VM's SSH keys), so no other VM's guest, nor any other program,
// accepts what it signs unless told to. Each VM has its own: a guest that
// reads its CA learns nothing it could use against another VM.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
	now    func() time.Time
}

// caValidity is a CA's life: a VM's, more or less; leafValidity a host
// certificate's, renewed well before it ends.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
)

// NewCA makes a CA for the VM called name: its certificate and its key, in
// PEM.
func NewCA(name string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "agent-vm proxy CA for " + name, Organization: []string{"agent-vm"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// LoadCA reads a CA NewCA made.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("the proxy's CA: not a PEM certificate and key")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the proxy's CA certificate: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, errors.New("the proxy's CA key cannot be read") // the error would not quote it, but say no more
	}
	key, ok := k.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, errors.New("the proxy's CA: the key or the certificate is not a CA's")
	}
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("the proxy's CA: the key does not match the certificate")
	}
	return &CA{cert: cert, key: key, leaves: map[string]*tls.Certificate{}, now: time.Now}, nil
}

// Certificate is the CA's certificate, which the guest trusts.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// leaf is a certificate for host signed by the CA, made once and kept
// until a day before it ends.
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	now := ca.now()
	if c, ok := ca.leaves[host]; ok && now.Before(c.Leaf.NotAfter.Add(-24*time.Hour)) {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	ca.leaves[host] = c
	return c, nil
}

// serial is a random certificate serial number (RFC 5280: positive, at
// most 20 octets).
func serial() *big.Int {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[0] = b[0]&0x7f | 0x40 // positive and never zero
	return new(big.Int).SetBytes(b)
}

// CAFiles returns the CA whose certificate and key (PEM) are the files
// certFile and keyFile, made (as NewCA(name)) and written on first use,
// readable only by their owner. The key is written first: a certificate
// without its key is made afresh.
func CAFiles(certFile, keyFile, name string) (certPEM, keyPEM []byte, err error) {
	cert, cerr := os.ReadFile(certFile)
	key, kerr := os.ReadFile(keyFile)
	switch {
	case cerr == nil && kerr == nil:
		return cert, key, nil
	case !errors.Is(cerr, fs.ErrNotExist) && cerr != nil:
		return nil, nil, fmt.Errorf("the VM's proxy CA: %w", cerr)
	case !errors.Is(kerr, fs.ErrNotExist) && kerr != nil:
		return nil, nil, fmt.Errorf("the VM's proxy CA: %w", kerr)
	}
	if cert, key, err = NewCA(name); err != nil {
		return nil, nil, fmt.Errorf("making the VM's proxy CA: %w", err)
	}
	if err := atomicfile.Write(keyFile, key, 0o600); err != nil {
		return nil, nil, err
	}
	if err := atomicfile.Write(certFile, cert, 0o600); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}
