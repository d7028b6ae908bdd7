// Package hostca finds the CA certificates this host trusts beyond its
// distribution's bundle: the ones an administrator added (Debian's
// /usr/local/share/ca-certificates, Fedora's and Arch's trust anchors) and
// the extra files SSL_CERT_FILE or NODE_EXTRA_CA_CERTS name. A guest that
// trusts them reaches what the host reaches through a TLS-inspecting proxy
// (corporate networks, these CI machines), as Lima's caCerts does.
//
// Certificates are public: they may go into seeds, vm.json and the Nix
// store. Private keys found beside them are never read.
package hostca

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// AnchorDirs are where distributions keep the CA certificates an
// administrator added (searched below, recursively).
var AnchorDirs = []string{
	"/usr/local/share/ca-certificates",          // Debian, Ubuntu (update-ca-certificates)
	"/etc/pki/ca-trust/source/anchors",          // Fedora, RHEL (update-ca-trust)
	"/etc/ca-certificates/trust-source/anchors", // Arch (trust)
}

// Bundles are the distributions' whole trust bundles: an SSL_CERT_FILE that
// names one adds nothing the guest's own bundle lacks (and would copy
// ~150 certificates), so it is skipped.
var Bundles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Arch
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"/etc/ssl/cert.pem",                  // Alpine, macOS-likes
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
}

// Max bounds how many certificates are passed on: a guest's trust is not a
// place for a whole bundle.
const Max = 64

// Cert is one certificate and where it was found.
type Cert struct {
	PEM     string // one "-----BEGIN CERTIFICATE-----" block
	Source  string // the file it came from
	Subject string
}

// Finder looks under Root (for tests; "" is /) with Getenv.
type Finder struct {
	Root   string
	Getenv func(string) string
}

// Find returns the host's added CA certificates, deduplicated, in a stable
// order, and a note for each file it skipped (unreadable, no certificate).
func (f Finder) Find() (certs []Cert, skipped []string, err error) {
	seen := map[[32]byte]bool{}
	add := func(path string) {
		raw, err := os.ReadFile(f.path(path))
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", path, err))
			return
		}
		found := 0
		for rest := raw; ; {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				continue // never a key, even if one sits in the file
			}
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil || !c.IsCA {
				continue
			}
			found++
			sum := sha256.Sum256(b.Bytes)
			if seen[sum] {
				continue
			}
			seen[sum] = true
			certs = append(certs, Cert{PEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.Bytes})),
				Source: path, Subject: c.Subject.String()})
		}
		if found == 0 {
			skipped = append(skipped, path+": no CA certificate in it")
		}
	}
	for _, dir := range AnchorDirs {
		var files []string
		_ = filepath.WalkDir(f.path(dir), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && (d.Type().IsRegular() || d.Type()&fs.ModeSymlink != 0) && certName(p) {
				rel, _ := filepath.Rel(f.path(dir), p)
				files = append(files, filepath.Join(dir, rel))
			}
			return nil
		})
		sort.Strings(files)
		for _, p := range files {
			add(p)
		}
	}
	for _, env := range []string{"NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE"} {
		p := f.Getenv(env)
		if p == "" || isBundle(p) {
			continue
		}
		add(p)
	}
	if len(certs) > Max {
		return nil, skipped, fmt.Errorf("the host trusts %d added CA certificates, more than the %d agent-vm passes to a guest (hint: point SSL_CERT_FILE at your distribution's bundle rather than a copy, or create the VM with --no-host-ca)", len(certs), Max)
	}
	return certs, skipped, nil
}

func (f Finder) path(p string) string {
	if f.Root == "" {
		return p
	}
	return filepath.Join(f.Root, p)
}

func certName(p string) bool {
	switch strings.ToLower(filepath.Ext(p)) {
	case ".crt", ".pem", ".cer":
		return true
	}
	return false
}

func isBundle(p string) bool {
	for _, b := range Bundles {
		if p == b {
			return true
		}
	}
	return false
}

// PEMs returns the certificates' PEM blocks.
func PEMs(certs []Cert) []string {
	out := make([]string, 0, len(certs))
	for _, c := range certs {
		out = append(out, c.PEM)
	}
	return out
}

// Load finds the host's added CA certificates (Finder, with getenv) as
// PEM texts, logging on log what it skipped and found.
func Load(getenv func(string) string, log hclog.Logger) ([]string, error) {
	certs, skipped, err := Finder{Getenv: getenv}.Find()
	for _, s := range skipped {
		log.Debug("not passing a host CA file to the guest", "file", s)
	}
	if err != nil {
		return nil, err
	}
	if len(certs) > 0 {
		log.Debug("the guest trusts the host's added CA certificates", "count", len(certs))
	}
	return PEMs(certs), nil
}
