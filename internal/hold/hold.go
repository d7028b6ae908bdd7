// Package hold is the held connection that makes `agent-vm exec` (and
// shell, attach, run, logs, mcp sync, start's checks) instant: one process
// per running VM, the holder (`agent-vm __hold`), keeps an authenticated
// SSH connection to the guest open and serves an SSH server on a unix
// socket, so a command does a fast local handshake instead of a full one
// with the guest (a second and more under TCG).
//
// The holder proxies channels, not commands: every channel a caller opens
// (session, direct-tcpip) is opened with the same type and extra data on
// the guest connection, every channel request goes both ways with its
// reply (pty-req, env, exec, shell, subsystem, window-change, signal,
// exit-status, exit-signal, eow@openssh.com, whatever comes), and the data,
// extended data, EOF and close of both directions follow. A caller cannot
// tell the holder from the guest's sshd, except by its host key. It opens
// no channel towards callers (the guest's forwarded-tcpip, agent and X11
// openings are refused, as agent-vm's direct connections refuse them) and
// answers callers' global requests (tcpip-forward) with a failure, except
// ReloadRequest.
//
// Reverse forwards (reverse.go) are the forwards the holder itself keeps on the
// held connection while the VM runs: the guest listens at a socket or loopback
// port, and the connections made there are served in the holder (the browser
// bridges of internal/bridge). Which reverse forwards are open is the holder's
// ReverseForwards function's answer, read at the start and at each ReloadRequest.
//
// The guest's sshd caps sessions per connection (MaxSessions, 10 by
// default): when the guest refuses a channel for that, the holder opens
// another connection to the guest and keeps it for later channels.
//
// Access is never wider than the VM's own SSH key: the socket is mode 0600
// in a 0700 directory of the VM's owner (the run directory, or the private
// socket directory of internal/sockdir when the state path is too long),
// the holder checks each caller's uid (SO_PEERCRED: the owner or root), and
// a caller must present the client key the holder made at its start
// (Files.Key, 0600) and pins the holder's host key (Files.HostKey). Both
// key pairs are new at every holder start and the host's private half
// never leaves the holder's memory. There is no TCP listener.
//
// Lifetime. vm starts the holder detached once the guest answers SSH, and
// stop ends it (Stop). The holder also ends by itself when the held guest
// connection ends: QEMU's exit closes its forwarded port, so the holder
// sees EOF at once, and a guest that stops answering (a frozen or paused
// QEMU) fails the holder's keepalives. This is the watch the egress proxy
// does on QEMU's pid file, but driver-neutral and without pid reuse.
//
// A held connection that drops (a guest reboot) ends the holder rather
// than redialing: callers already fall back to dialing the guest directly
// when the socket is missing or dead (Dial's error), which is always
// correct, while a redialing holder would have to refuse callers during
// the redial, tell a reboot from a VM that is gone, and could serve a
// connection to a guest that changed under it. `agent-vm start` on a
// running VM starts a holder again when none runs.
package hold

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sockdir"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
)

// File names of a holder in the VM's run directory (the socket in its
// socket directory, see sockdir).
const (
	SocketName  = "hold.sock"
	KeyName     = "hold-key"
	HostKeyName = "hold-host-key.pub"
	PidName     = "hold.pid"
	LogName     = "hold.log"
)

// Files are a holder's files.
type Files struct {
	Socket  string // the unix socket callers dial (0600)
	Key     string // the callers' private key (0600), made by the holder
	HostKey string // the holder's public host key, which callers pin (0600)
	Pid     string // the holder's pid, written by whoever starts it
}

// FilesFor names the holder's files of the VM with this run directory and
// UUID.
func FilesFor(runDir, uuid string) Files {
	return Files{
		Socket:  filepath.Join(sockdir.For(runDir, uuid), SocketName),
		Key:     filepath.Join(runDir, KeyName),
		HostKey: filepath.Join(runDir, HostKeyName),
		Pid:     filepath.Join(runDir, PidName),
	}
}

// localKex is the key exchange of a caller's handshake with the holder:
// X25519. x/crypto's default, the hybrid mlkem768x25519-sha256, guards
// against a recorded session being decrypted by a future quantum computer;
// this one never leaves the host (a unix socket of the VM's owner), and
// its handshake costs a fifth of the hybrid's (measured here: 1.9 ms
// against 9.4 ms per handshake, client and server in one process). The
// holder's own connection to the guest keeps the default.
const localKex = "curve25519-sha256"

// ErrNoHolder means no holder serves these files: the socket is missing or
// nothing listens on it. Callers dial the guest directly then.
var ErrNoHolder = errors.New("no holder serves the VM")

// Dial connects to the holder of f as user, pinning its host key. Its
// handshake is local and fast; timeout bounds it.
func Dial(ctx context.Context, f Files, user string, timeout time.Duration) (*ssh.Client, error) {
	if _, err := os.Lstat(f.Socket); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoHolder, err)
	}
	signer, err := sshkeys.LoadSigner(f.Key)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(f.HostKey)
	if err != nil {
		return nil, fmt.Errorf("reading the holder's host key: %w", err)
	}
	pinned, _, _, _, err := ssh.ParseAuthorizedKey(b)
	if err != nil {
		return nil, fmt.Errorf("parsing the holder's host key %s: %w", f.HostKey, err)
	}
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "unix", f.Socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoHolder, err)
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	cfg := &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.FixedHostKey(pinned), HostKeyAlgorithms: []string{ssh.KeyAlgoED25519}, Timeout: timeout}
	cfg.KeyExchanges = []string{localKex}
	c, chans, reqs, err := ssh.NewClientConn(conn, f.Socket, cfg)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("the holder's handshake on %s: %w", f.Socket, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}
