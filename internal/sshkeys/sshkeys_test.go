package sshkeys

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

func TestGenerateWriteAndParse(t *testing.T) {
	dir := t.TempDir()
	p, err := Generate("agent-vm feature-x")
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "id_ed25519")
	if err := p.Write(key); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{key: 0o600, key + ".pub": 0o644} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	signer, err := LoadSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(signer.PublicKey().Marshal(), p.Public.Marshal()) {
		t.Error("private key on disk does not match the public key")
	}
	pub, comment, _, _, err := ssh.ParseAuthorizedKey(p.AuthorizedKey)
	if err != nil {
		t.Fatal(err)
	}
	if pub.Type() != ssh.KeyAlgoED25519 || comment != "agent-vm feature-x" {
		t.Errorf("authorized key: type %q comment %q", pub.Type(), comment)
	}
	if err := p.Write(key); err == nil {
		t.Error("Write over an existing key succeeded; it must refuse")
	}
}

func TestKnownHostsLinePinsOnlyThatKey(t *testing.T) {
	host, _ := Generate("")
	other, _ := Generate("")
	path := filepath.Join(t.TempDir(), "known_hosts")
	line := KnownHostsLine(2222, host.Public)
	if !strings.HasPrefix(line, "[127.0.0.1]:2222 ssh-ed25519 ") {
		t.Errorf("line %q", line)
	}
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	cb, err := HostKeyCallback(path)
	if err != nil {
		t.Fatal(err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2222}
	if err := cb("127.0.0.1:2222", addr, host.Public); err != nil {
		t.Errorf("pinned key refused: %v", err)
	}
	err = cb("127.0.0.1:2222", addr, other.Public)
	var ke *knownhosts.KeyError
	if err == nil || !errors.As(err, &ke) || len(ke.Want) == 0 {
		t.Errorf("a different host key must be refused as a mismatch, got %v", err)
	}
	if err := cb("127.0.0.1:2223", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2223}, host.Public); err == nil {
		t.Error("the key must be pinned to its port only")
	}
}
