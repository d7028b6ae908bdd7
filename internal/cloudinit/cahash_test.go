package cloudinit

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// subjectHash names every certificate of this host's bundle as OpenSSL
// does: ~140 real CAs, with PrintableString, UTF8String, T61String and
// BMPString names, mixed case and spaces; and agent-vm's own test CAs.
func TestSubjectHashIsOpenSSLs(t *testing.T) {
	openssl := testutil.Program(t, "openssl")
	files, err := filepath.Glob("/etc/ssl/certs/*.pem")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("only %d certificates in /etc/ssl/certs (package ca-certificates)", len(files))
	}
	ca, _, _ := testutil.SelfSigned(t, "agent-vm  Test\tCA ", true)
	mine := filepath.Join(t.TempDir(), "mine.pem")
	if err := os.WriteFile(mine, []byte(ca), 0o644); err != nil {
		t.Fatal(err)
	}
	files = append(files, mine, filepath.Join("testdata", "keys", "host-ca.pem"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: openssl, Args: []string{"x509", "-hash", "-noout", "-in", f}})
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		want := strings.TrimSpace(string(res.Stdout))
		if got, err := subjectHash(string(b)); err != nil || got != want {
			t.Errorf("%s: subjectHash = %q, %v; openssl says %s", f, got, err, want)
		}
	}
}

func TestSubjectHashRefusesWhatIsNoCertificate(t *testing.T) {
	for _, bad := range []string{"", "not PEM", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"} {
		if h, err := subjectHash(bad); err == nil {
			t.Errorf("subjectHash(%q) = %s", bad, h)
		}
	}
}
