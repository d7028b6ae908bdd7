package scenario

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
)

// shareEscape is what the guest's root tries in the workspace, one
// "what:exit status" line each (docs/security.md, "The workspace share"). It runs as
// the guest user, with sudo where root is the point.
const shareEscape = `cd /workspace
printf '#!/bin/sh\necho ok\n' > esc-script; chmod 755 esc-script; echo "chmod755:$?"
./esc-script >/dev/null; echo "run:$?"
git status --porcelain >/dev/null; echo "git:$?"
sudo sh -c 'echo root > esc-root' 2>/dev/null; echo "root-create:$?"
echo x > esc-suid
sudo chown root:root esc-suid 2>/dev/null; echo "chown:$?"
sudo chmod 4755 esc-suid 2>/dev/null; echo "chmod4755:$?"
sudo chmod 2755 esc-suid 2>/dev/null; echo "chmod2755:$?"
sudo mknod esc-null c 1 3 2>/dev/null; echo "mknod:$?"
sudo mkfifo esc-fifo 2>/dev/null; echo "mkfifo:$?"
ln -s /etc/shadow esc-shadow; echo "symlink-shadow:$?"
ln -s "$1" esc-canary; echo "symlink-canary:$?"
`

// escapeFiles are the files shareEscape may leave, but the symlinks (kept
// for destroy's refusal to list).
var escapeFiles = []string{"esc-script", "esc-root", "esc-suid", "esc-null", "esc-fifo"}

// checkShareNotAnEscape: from inside the guest, with sudo, try to make
// setuid, root-owned and special files in the workspace, and symlinks out
// of it; on the host none of those exist as such, the guest user's normal
// work still does, and agent-vm's host-side commands do not follow the
// symlinks. canary is a host file the symlink esc-canary names; its
// content must never appear in what agent-vm prints.
func checkShareNotAnEscape(ctx context.Context, s *harness.S, st *blackbox.Status, canary string) error {
	res, err := s.ExecOK(ctx, st.Branch, "sh", "-c", shareEscape, "sh", canary)
	if err != nil {
		return err
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		k, v, _ := strings.Cut(l, ":")
		got[k] = v
	}
	for _, k := range []string{"chmod755", "run", "git", "symlink-shadow", "symlink-canary"} {
		if got[k] != "0" {
			return harness.Failf(res, "the guest user's %s failed in the workspace (status %q)", k, got[k])
		}
	}
	if got["mknod"] == "0" {
		return harness.Failf(res, "mknod of a device node in the workspace succeeded")
	}
	ws := st.Paths.Workspace
	wsUID, wsGID, err := owner(ws)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(filepath.Join(ws, "esc-script")); err != nil || fi.Mode().Perm() != 0o755 {
		return harness.Failf(res, "esc-script on the host: %v, %v; want mode 0755", fi.Mode(), err)
	}
	var notes []string
	for _, name := range escapeFiles[1:] {
		p := filepath.Join(ws, name)
		fi, err := os.Lstat(p)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		uid, gid, _ := owner(p)
		switch {
		case uid != wsUID || gid != wsGID:
			return harness.Failf(res, "%s belongs to %d:%d on the host; the workspace's owner is %d:%d", name, uid, gid, wsUID, wsGID)
		case fi.Mode()&os.ModeDevice != 0:
			return harness.Failf(res, "%s is a device node on the host (%v)", name, fi.Mode())
		case st.Share == "virtiofs" && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0:
			return harness.Failf(res, "%s is %v on the host", name, fi.Mode())
		case st.Share == "virtiofs" && !fi.Mode().IsRegular():
			return harness.Failf(res, "%s is %v on the host, not a regular file", name, fi.Mode())
		case fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeNamedPipe) != 0:
			notes = append(notes, fmt.Sprintf("%s %v (9p: the owner's own set-id bits and FIFOs)", name, fi.Mode()))
		}
	}
	for _, name := range []string{"esc-shadow", "esc-canary"} {
		if fi, err := os.Lstat(filepath.Join(ws, name)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			return harness.Failf(res, "%s on the host: %v, %v; want the guest's symlink", name, fi.Mode(), err)
		}
	}
	// Git works from the host side too (as root on the owner's files, it
	// needs safe.directory).
	if out, err := exec.CommandContext(ctx, "git", "-c", "safe.directory=*", "-C", ws, "status", "--porcelain").CombinedOutput(); err != nil || !strings.Contains(string(out), "esc-script") {
		return harness.Failf(res, "git status on the host: %v: %s", err, out)
	}
	if err := checkNoCanary(ctx, s, canary, []string{"status", st.Branch}, []string{"mcp", "sync", "--dry-run", st.Branch}); err != nil {
		return err
	}
	for _, name := range escapeFiles {
		_ = os.Remove(filepath.Join(ws, name))
	}
	s.Notef("over %s: %s", st.Share, orNone(strings.Join(notes, "; ")))
	return nil
}

// checkNoCanary runs agent-vm commands (any exit status) and fails when
// one prints the canary file's content or the host's shadow file's.
func checkNoCanary(ctx context.Context, s *harness.S, canary string, cmds ...[]string) error {
	secret, err := os.ReadFile(canary)
	if err != nil {
		return err
	}
	for _, c := range cmds {
		res := s.AgentVM(ctx, c...)
		out := res.Stdout + res.Stderr
		if strings.Contains(out, strings.TrimSpace(string(secret))) || strings.Contains(out, "root:$") || strings.Contains(out, "root:*:") || strings.Contains(out, "root:!") {
			return harness.Failf(res, "`agent-vm %s` followed a symlink the guest wrote", strings.Join(c, " "))
		}
	}
	return nil
}

// writeCanary makes the host file the guest's symlink names.
func writeCanary(dir string) (string, error) {
	p := filepath.Join(dir, "share-canary")
	return p, os.WriteFile(p, []byte("agent-vm-canary-"+harness.RandHex(8)+"\n"), 0o644)
}

func orNone(s string) string {
	if s == "" {
		return "nothing got through"
	}
	return s
}
