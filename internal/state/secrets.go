package state

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
)

// MakeDirs makes the VM directory's ssh, secrets, run and logs
// directories, 0700.
func (l Layout) MakeDirs() error {
	for _, d := range []string{l.SSHDir(), l.SecretsDir(), l.RunDir(), l.LogsDir()} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	return nil
}

// WriteSecrets makes the client key, the guest's host key, the pinned
// known_hosts line and the MCP bearer token.
func WriteSecrets(l Layout, rec *Record) error {
	client, err := sshkeys.Generate("agent-vm " + rec.Slug)
	if err != nil {
		return err
	}
	if err := client.Write(l.ClientKey()); err != nil {
		return err
	}
	host, err := sshkeys.Generate("agent-vm host " + rec.Slug)
	if err != nil {
		return err
	}
	if err := host.Write(l.HostKey()); err != nil {
		return err
	}
	if err := atomicfile.Write(l.KnownHosts(), []byte(sshkeys.KnownHostsLine(rec.Ports.SSH, host.Public)), 0o600); err != nil {
		return err
	}
	token := make([]byte, 32)
	if _, err := rand.Read(token); err != nil {
		return fmt.Errorf("generating the MCP token: %w", err)
	}
	return atomicfile.Write(l.MCPToken(), []byte(hex.EncodeToString(token)+"\n"), 0o600)
}

// HostPublic reads the VM's SSH host public key (WriteSecrets made it).
func (l Layout) HostPublic() (ssh.PublicKey, error) {
	pub, err := os.ReadFile(l.HostPubKey())
	if err != nil {
		return nil, fmt.Errorf("reading the VM's host key: %w", err)
	}
	hk, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", l.HostPubKey(), err)
	}
	return hk, nil
}

// PinHostKey writes, at path, the known_hosts that pins the VM's host key
// at 127.0.0.1:port: its own (l.KnownHosts()) when its SSH port moved, or
// one for a wait on a guest that is still this VM (a clone of it).
func (l Layout) PinHostKey(path string, port int) error {
	hk, err := l.HostPublic()
	if err != nil {
		return err
	}
	return atomicfile.Write(path, []byte(sshkeys.KnownHostsLine(port, hk)), 0o600)
}

// ReadToken reads the VM's MCP bearer token (WriteSecrets made it).
func (l Layout) ReadToken() (string, error) {
	b, err := os.ReadFile(l.MCPToken())
	if err != nil {
		return "", fmt.Errorf("reading the MCP token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
