// Package sshkeys makes the ed25519 key pairs a VM needs (the user's client
// key and the guest's host key) and the pinned known_hosts line, so no
// connection ever needs StrictHostKeyChecking=no.
package sshkeys

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Pair is an ed25519 key pair in OpenSSH encodings.
type Pair struct {
	PrivatePEM    []byte        // OpenSSH private key (PEM "OPENSSH PRIVATE KEY")
	AuthorizedKey []byte        // "ssh-ed25519 AAAA... comment\n"
	Public        ssh.PublicKey //
}

// Generate makes a new ed25519 key pair with the given comment.
func Generate(comment string) (Pair, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("generating ed25519 key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return Pair{}, fmt.Errorf("encoding private key: %w", err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return Pair{}, fmt.Errorf("encoding public key: %w", err)
	}
	line := ssh.MarshalAuthorizedKey(sshPub) // ends in "\n"
	if comment != "" {
		line = append(line[:len(line)-1], []byte(" "+comment+"\n")...)
	}
	return Pair{PrivatePEM: pem.EncodeToMemory(block), AuthorizedKey: line, Public: sshPub}, nil
}

// Write stores the pair as path (0600) and path.pub (0644). The directory
// must exist; it should be 0700.
func (p Pair) Write(path string) error {
	if err := writeNew(path, p.PrivatePEM, 0o600); err != nil {
		return err
	}
	return writeNew(path+".pub", p.AuthorizedKey, 0o644)
}

func writeNew(path string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("writing key %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("writing key %s: %w", path, err)
	}
	return f.Close()
}

// KnownHostsLine is the known_hosts entry that pins key for 127.0.0.1:port,
// in the form both OpenSSH and x/crypto/ssh/knownhosts read.
func KnownHostsLine(port int, key ssh.PublicKey) string {
	addr := knownhosts.Normalize(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	return knownhosts.Line([]string{addr}, key) + "\n"
}

// LoadSigner reads an OpenSSH private key file.
func LoadSigner(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading key %s: %w", path, err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("parsing key %s: %w", filepath.Base(path), err)
	}
	return s, nil
}

// HostKeyCallback returns a callback that accepts only the keys pinned in the
// known_hosts file.
func HostKeyCallback(knownHostsPath string) (ssh.HostKeyCallback, error) {
	cb, err := knownhosts.New(knownHostsPath)
	if err != nil {
		return nil, fmt.Errorf("reading pinned host key %s: %w", knownHostsPath, err)
	}
	return cb, nil
}
