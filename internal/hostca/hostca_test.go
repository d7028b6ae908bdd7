package hostca

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

// newCert makes a self-signed certificate (a CA or a leaf) and its key, PEM.
func newCert(t *testing.T, name string, ca bool) (cert, key string) {
	t.Helper()
	cert, _, k := testutil.SelfSigned(t, name, ca)
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return cert, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}))
}

func write(t *testing.T, root, path, content string) {
	t.Helper()
	p := filepath.Join(root, path)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFindTheHostsAddedCAs(t *testing.T) {
	root := t.TempDir()
	corp, corpKey := newCert(t, "Corp Root CA", true)
	proxy, _ := newCert(t, "Egress Proxy CA", true)
	extra, _ := newCert(t, "Node Extra CA", true)
	leaf, _ := newCert(t, "a server, not a CA", false)
	write(t, root, "usr/local/share/ca-certificates/corp.crt", corp+corpKey) // a key beside it is never taken
	write(t, root, "usr/local/share/ca-certificates/sub/proxy.crt", proxy)
	write(t, root, "usr/local/share/ca-certificates/copy-of-corp.crt", corp) // the same certificate twice
	write(t, root, "usr/local/share/ca-certificates/leaf.crt", leaf)
	write(t, root, "usr/local/share/ca-certificates/README", "not a certificate")
	write(t, root, "etc/pki/ca-trust/source/anchors/broken.pem", "-----BEGIN CERTIFICATE-----\nnot base64\n")
	write(t, root, "opt/node-extra.pem", extra)
	env := map[string]string{"NODE_EXTRA_CA_CERTS": "/opt/node-extra.pem", "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
	certs, skipped, err := Finder{Root: root, Getenv: func(k string) string { return env[k] }}.Find()
	if err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for _, c := range certs {
		subjects = append(subjects, c.Subject)
		if strings.Contains(c.PEM, "PRIVATE KEY") {
			t.Errorf("%s: a private key was taken", c.Source)
		}
	}
	if got, want := strings.Join(subjects, "; "), "CN=Corp Root CA; CN=Egress Proxy CA; CN=Node Extra CA"; got != want {
		t.Errorf("found %s, want %s", got, want)
	}
	notes := strings.Join(skipped, "\n")
	for _, want := range []string{"broken.pem: no CA certificate", "leaf.crt: no CA certificate"} {
		if !strings.Contains(notes, want) {
			t.Errorf("skipped notes lack %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, "README") || strings.Contains(notes, "ca-certificates.crt") {
		t.Errorf("non-certificate names or the system bundle were read:\n%s", notes)
	}
}

func TestFindRefusesABundleInDisguise(t *testing.T) {
	root := t.TempDir()
	var bundle strings.Builder
	for i := 0; i <= Max; i++ {
		c, _ := newCert(t, "CA "+string(rune('A'+i%26))+string(rune('a'+i/26)), true)
		bundle.WriteString(c)
	}
	write(t, root, "home/me/my-bundle.pem", bundle.String())
	_, _, err := Finder{Root: root, Getenv: func(k string) string {
		if k == "SSL_CERT_FILE" {
			return "/home/me/my-bundle.pem"
		}
		return ""
	}}.Find()
	if err == nil || !strings.Contains(err.Error(), "--no-host-ca") {
		t.Errorf("a whole bundle in SSL_CERT_FILE: %v, want a refusal with a hint", err)
	}
}
