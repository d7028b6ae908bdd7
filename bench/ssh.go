package main

import (
	"context"
	"fmt"
	"time"
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
