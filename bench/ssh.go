package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// sshTarget is a guest reached with OpenSSH: the reference client for P1
// and P3.
type sshTarget struct {
	Port       int
	User       string
	Key        string
	KnownHosts string
}

// sshArgv is OpenSSH's command line for running cmd in the guest: the
// VM's key only, the pinned host key checked, no user or system config.
func (t sshTarget) sshArgv(cmd ...string) []string {
	argv := []string{"ssh", "-F", "/dev/null",
		"-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
		"-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + t.KnownHosts,
		"-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
		"-i", t.Key, "-p", fmt.Sprint(t.Port), t.User + "@127.0.0.1"}
	return append(argv, cmd...)
}

// sshRun runs cmd in the guest with OpenSSH.
func sshRun(ctx context.Context, t sshTarget, timeout time.Duration, cmd ...string) cmdResult {
	argv := t.sshArgv(cmd...)
	return runCmd(ctx, cmdSpec{Path: argv[0], Args: argv[1:], Timeout: timeout})
}

// waitSSH polls until OpenSSH runs `true` in the guest, every 250 ms at
// first, backing off to 1 s (a finer poll than agent-vm's own, so the
// reference is close to the moment sshd answers). Until sshd listens,
// QEMU's user-mode network accepts and resets the connection: that is
// "not yet". It gives up when exited closes (QEMU is gone) or ctx ends.
func waitSSH(ctx context.Context, t sshTarget, exited <-chan struct{}) error {
	delay := 250 * time.Millisecond
	var last cmdResult
	for {
		last = sshRun(ctx, t, 30*time.Second, "true")
		if last.Err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("SSH not ready (last: %v): %w", last.Err, ctx.Err())
		case <-exited:
			return fmt.Errorf("QEMU exited before SSH answered")
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}

// held is a Go SSH connection to a guest (x/crypto/ssh, the library
// agent-vm uses), kept open: a session on it is the least any exec can
// cost, P3's floor.
type held struct{ c *ssh.Client }

// dialHeld connects with the VM's key, checking the pinned host key.
func dialHeld(t sshTarget) (*held, error) {
	pem, err := os.ReadFile(t.Key)
	if err != nil {
		return nil, err
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", t.Key, err)
	}
	hostKey, err := knownhosts.New(t.KnownHosts)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", t.KnownHosts, err)
	}
	c, err := ssh.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(t.Port)), &ssh.ClientConfig{
		User: t.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostKey, Timeout: 30 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("connecting to 127.0.0.1:%d: %w", t.Port, err)
	}
	return &held{c: c}, nil
}

// run opens a session on the connection and runs cmd in it.
func (h *held) run(cmd string) cmdResult {
	res := cmdResult{Line: "(session on an open connection) " + cmd, Exit: -1, Start: time.Now()}
	s, err := h.c.NewSession()
	if err == nil {
		err = s.Run(cmd)
		s.Close()
		if err == nil {
			res.Exit = 0
		}
	}
	res.End, res.Err = time.Now(), err
	return res
}

func (h *held) Close() error { return h.c.Close() }
