package qemu

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/sharejail"
)

// virtiofsdPaths are where distributions install virtiofsd besides PATH:
// Debian/Ubuntu's QEMU ships the C one in /usr/lib/qemu, Fedora and others
// put the Rust one in /usr/libexec.
func virtiofsdPaths() []string {
	return []string{"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd", "/usr/lib/virtiofsd"}
}

// Virtiofsd is a found virtiofsd binary.
type Virtiofsd struct {
	Path string
	Rust bool // the Rust implementation (different flags from QEMU's C one)
}

// FindVirtiofsd looks for virtiofsd on PATH and in the usual places.
func FindVirtiofsd(ctx context.Context, run execx.Runner) (*Virtiofsd, error) {
	return findVirtiofsd(ctx, run, virtiofsdPaths())
}

func findVirtiofsd(ctx context.Context, run execx.Runner, places []string) (*Virtiofsd, error) {
	cands := places
	if p, err := run.LookPath("virtiofsd"); err == nil {
		cands = append([]string{p}, cands...)
	}
	for _, p := range cands {
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			continue
		}
		res, err := run.Run(ctx, execx.Cmd{Path: p, Args: []string{"--help"}})
		help := string(res.Stdout) + string(res.Stderr)
		if err != nil && help == "" {
			continue
		}
		return &Virtiofsd{Path: p, Rust: strings.Contains(help, "--shared-dir")}, nil
	}
	return nil, fmt.Errorf("virtiofsd not found on PATH or in %s (hint: install it: Debian 12's package qemu-system-common has it, newer Debian/Ubuntu and Fedora package it as virtiofsd; without it the workspace is shared over 9p, which is slower for many small files)", strings.Join(places, ", "))
}

// cacheOption is the cache mode in this virtiofsd's words: the Rust one
// calls none "never".
func (v *Virtiofsd) cacheOption(mode string) string {
	if v.Rust && mode == driver.ShareCacheNone {
		return "never"
	}
	return mode
}

// args is virtiofsd's command line for sharing s on sock.
func (v *Virtiofsd) args(s driver.Share, sock string) []string {
	cache := v.cacheOption(s.CacheMode())
	if v.Rust {
		args := []string{"--socket-path", sock, "--shared-dir", s.Source, "--cache", cache}
		if os.Geteuid() != 0 {
			// Unprivileged: no namespace sandbox; the process's own uid
			// owns what the guest writes.
			args = append(args, "--sandbox", "none")
		}
		return args
	}
	return []string{"--socket-path=" + sock, "-o", "source=" + s.Source, "-o", "cache=" + cache}
}

// VirtiofsdShare is one virtiofsd: the share it serves on Socket, its
// output to Log.
type VirtiofsdShare struct {
	Share  driver.Share
	Socket string
	Log    string
}

// Jailed reports whether v serving s runs in agent-vm's jail (package
// sharejail) when agent-vm's effective uid is euid: as root, QEMU's C
// virtiofsd for a share whose owner is known. Unjailed as root (the Rust
// one, or an unknown owner), what the guest's root does in the share is
// done as root on the host.
func (v *Virtiofsd) Jailed(euid int, s driver.Share) bool {
	return !v.Rust && euid == 0 && s.UID > 0 && s.GID > 0
}

// virtiofsdProcess is how virtiofsd runs for s. As root, QEMU's C
// virtiofsd runs in agent-vm's jail (package sharejail) as the workspace's
// owner, so what the guest's root does in the workspace cannot make
// setuid, root-owned or special files on the host.
func (l *Launcher) virtiofsdProcess(v *Virtiofsd, s VirtiofsdShare) (execx.Detached, error) {
	d := execx.Detached{Path: v.Path, Args: v.args(s.Share, s.Socket), StdoutPath: s.Log}
	if !v.Jailed(l.euid(), s.Share) {
		return d, nil
	}
	self := l.Self
	if self == nil {
		self = os.Executable
	}
	exe, err := self()
	if err != nil {
		return d, fmt.Errorf("finding agent-vm's own binary for the virtiofsd jail: %w", err)
	}
	spec := sharejail.Spec{UID: s.Share.UID, GID: s.Share.GID, Source: s.Share.Source, SocketPath: s.Socket,
		Virtiofsd: v.Path, Options: []string{"-o", "cache=" + v.cacheOption(s.Share.CacheMode())}}
	d.Path, d.Args = exe, spec.Args()
	return d, nil
}

// StartVirtiofsd starts v serving s, as the QEMU launcher does (jailed as
// root, see Jailed), for a machine another driver runs (the vagrant one),
// and waits for its socket. It returns virtiofsd's pid (the jail's, as
// root); on failure the process is gone and the error says why.
func StartVirtiofsd(ctx context.Context, run execx.Runner, v *Virtiofsd, s VirtiofsdShare) (int, error) {
	return (&Launcher{Run: run}).startShare(ctx, v, s)
}

// StopVirtiofsd kills the virtiofsd serving socket: pid if it is that
// process, else whichever process is. It reports whether one was killed.
func StopVirtiofsd(pid int, socket string) bool {
	match := isVirtiofsdFor(socket)
	if !proc.Verified(pid, match) {
		pid = proc.Find(match)
	}
	return pid > 0 && proc.Kill(pid, match)
}

// startVirtiofsd starts virtiofsd for the machine's share and waits for its
// socket. On failure the process is gone and the error says why.
func (l *Launcher) startVirtiofsd(ctx context.Context, v *Virtiofsd, m Machine) (int, error) {
	return l.startShare(ctx, v, VirtiofsdShare{Share: m.Share, Socket: m.sockFile(VirtiofsdSock), Log: m.logFile(VirtiofsdLog)})
}

func (l *Launcher) startShare(ctx context.Context, v *Virtiofsd, s VirtiofsdShare) (int, error) {
	sock := s.Socket
	_ = os.Remove(sock)
	d, err := l.virtiofsdProcess(v, s)
	if err != nil {
		return 0, err
	}
	p, err := l.Run.Start(d)
	if err != nil {
		return 0, fmt.Errorf("starting virtiofsd: %w", err)
	}
	wait := newBackoff(10*time.Millisecond, 200*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return p.Pid(), nil
		}
		select {
		case <-p.Exited():
			return 0, fmt.Errorf("virtiofsd exited at once (code %d): %s", p.ExitCode(), driver.TailFile(s.Log, 3))
		case <-ctx.Done():
			proc.Kill(p.Pid(), isVirtiofsdFor(sock))
			return 0, ctx.Err()
		case <-time.After(wait.next()):
		}
		if time.Now().After(deadline) {
			proc.Kill(p.Pid(), isVirtiofsdFor(sock))
			return 0, fmt.Errorf("virtiofsd did not create its socket %s within 10s: %s", sock, driver.TailFile(s.Log, 3))
		}
	}
}

// isVirtiofsdFor matches a virtiofsd serving this socket.
func isVirtiofsdFor(sock string) func(args []string) bool {
	return func(args []string) bool {
		for i, a := range args {
			if a == "--socket-path="+sock || (a == "--socket-path" && i+1 < len(args) && args[i+1] == sock) {
				return true
			}
		}
		return false
	}
}

// backoff yields growing delays up to a cap.
type backoff struct{ cur, max time.Duration }

func newBackoff(start, max time.Duration) *backoff { return &backoff{cur: start, max: max} }

func (b *backoff) next() time.Duration {
	d := b.cur
	if b.cur *= 2; b.cur > b.max {
		b.cur = b.max
	}
	return d
}
