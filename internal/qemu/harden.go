package qemu

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// Hardening is how the launcher confines a QEMU process beyond the
// guest's own boundary: a seccomp filter (-sandbox) and, when agent-vm
// runs as root, the unprivileged user QEMU becomes once it has opened its
// files (-runas).
type Hardening struct {
	// Sandbox is QEMU's seccomp policy; nil runs QEMU without one (only
	// when the user said so: see ErrNoSandbox).
	Sandbox *SandboxPolicy
	// RunAs is the user QEMU drops to; nil keeps the caller's.
	RunAs *Owner
}

// Owner is a numeric user and group.
type Owner struct{ UID, GID int }

// SandboxPolicy is QEMU's -sandbox: the seccomp filter QEMU installs on
// itself before the guest runs. What each relaxation costs:
//
//   - AllowSpawn lets QEMU fork and exec. A slirp `guestfwd=...-cmd:`
//     rule needs it: QEMU runs the command itself, per connection, and
//     every VM's network reaches its egress proxy and exposed ports that
//     way (guestfwd=...-cmd:agent-vm net-relay ...). With it a QEMU
//     compromised through a device bug can start any program the QEMU
//     user can (the workspace's owner under -runas, never root there).
//   - AllowSetuid keeps the set*uid/set*gid calls. QEMU 7.2 installs the
//     filter before it handles -runas, so dropping to another user needs
//     them (with elevateprivileges=deny QEMU dies of SIGSYS). Once QEMU has
//     dropped to an unprivileged user they gain it nothing: it has no uid
//     to go back to.
type SandboxPolicy struct {
	AllowSpawn  bool
	AllowSetuid bool
}

// Option is the -sandbox value: on, obsolete system calls denied, no
// changing of CPU affinity, scheduling or priorities; privilege changes and
// new processes only as the policy allows.
func (p SandboxPolicy) Option() string {
	allow := func(b bool) string {
		if b {
			return "allow"
		}
		return "deny"
	}
	return "on,obsolete=deny,elevateprivileges=" + allow(p.AllowSetuid) + ",spawn=" + allow(p.AllowSpawn) + ",resourcecontrol=deny"
}

// Sandbox is the policy for a machine: the strictest one, relaxed only
// where a QEMU option in use needs it: -runas (AllowSetuid) and guestfwd
// commands, the network's guestfwd commands (AllowSpawn; see SandboxPolicy).
func Sandbox(runAs *Owner, guestfwdCmd bool) SandboxPolicy {
	return SandboxPolicy{AllowSetuid: runAs != nil, AllowSpawn: guestfwdCmd}
}

// hardeningArgs are the -sandbox and -runas options.
func hardeningArgs(h Hardening) []string {
	var out []string
	if h.Sandbox != nil {
		out = append(out, "-sandbox", h.Sandbox.Option())
	}
	if h.RunAs != nil {
		out = append(out, "-runas", strconv.Itoa(h.RunAs.UID)+":"+strconv.Itoa(h.RunAs.GID))
	}
	return out
}

// ErrNoSandbox is a QEMU that cannot run under agent-vm's seccomp policy.
var ErrNoSandbox = errors.New("QEMU cannot sandbox itself")

// CheckSandbox starts qemu with the policy (and -runas) on an empty
// machine and asks it to quit over QMP: about 50 ms. A QEMU built without
// seccomp, or one whose filter the kernel refuses, fails here with its own
// words rather than in the middle of a boot.
func CheckSandbox(ctx context.Context, run execx.Runner, qemu string, h Hardening) error {
	if h.Sandbox == nil {
		return nil
	}
	args := append([]string{"-machine", "none", "-nodefaults", "-display", "none", "-S", "-qmp", "stdio"}, hardeningArgs(h)...)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := run.Run(cctx, execx.Cmd{Path: qemu, Args: args,
		Stdin: strings.NewReader(`{"execute":"qmp_capabilities"}` + "\n" + `{"execute":"quit"}` + "\n")})
	if err == nil && strings.Contains(string(res.Stdout), `"host-qmp-quit"`) {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	why := "it did not answer"
	var ee *execx.Error
	switch {
	case errors.As(err, &ee) && ee.Stderr != "":
		why = execx.TailLines(ee.Stderr, 2)
	case errors.As(err, &ee) && ee.ExitCode == -1:
		why = "it was killed (a seccomp filter refused one of its own calls)"
	case err != nil:
		why = err.Error()
	}
	return fmt.Errorf("%w: `%s -sandbox %s` failed: %s (hint: install a QEMU built with seccomp support, as Debian's and Fedora's are; to run VMs without QEMU's sandbox anyway, set AGENT_VM_QEMU_SANDBOX=off)",
		ErrNoSandbox, qemu, h.Sandbox.Option(), why)
}
