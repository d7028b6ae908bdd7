package hostlink

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// link is the link to this machine's real sshd (internal/sshx/sshdtest,
// root) standing in for a host. The host is this machine, so a test reads
// what Install did with os.Stat; the directories given to Install have a
// space in their path so that quoting is exercised on the way.
func link(t *testing.T) (*ssh.Client, string) {
	t.Helper()
	srv := sshdtest.New(t)
	tu.Program(t, "pgrep") // Install runs it on the host
	srv.Start()
	c, err := Dial(context.Background(), Target{Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, srv.Addr
}

// fakeBinary writes a stand-in for agent-vm's binary: a shell script whose
// `version` prints "agent-vm test VERSION", and which otherwise waits for
// its stdin to close (a process running the copy). It returns its path
// and sha256.
func fakeBinary(t *testing.T, version string) (string, string) {
	t.Helper()
	body := "#!/bin/sh\n" +
		"if [ \"$1\" = version ]; then echo 'agent-vm test " + version + "'; exit 0; fi\n" +
		"read -r line\n"
	p := filepath.Join(t.TempDir(), "agent-vm")
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(body))
	return p, hex.EncodeToString(sum[:])
}

// running starts the copy at p here, waiting on its stdin, and returns
// what stops it. It runs as `/bin/sh p`, named in its command line as
// agent-vm starts a copy. Started locally rather than over SSH: the host
// is this machine, and a local child is stopped for certain.
func running(t *testing.T, p string) (stop func()) {
	t.Helper()
	cmd := exec.Command(p)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() {
		in.Close()
		cmd.Wait()
	}
	t.Cleanup(stop)
	return stop
}

// checkCopy fails unless p is a regular file of this user's, 0755, with
// src's content.
func checkCopy(t *testing.T, p, src string) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o755 || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Geteuid() {
		t.Errorf("%s: mode %v, uid %d; want a regular file, 0755, uid %d", p, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, os.Geteuid())
	}
	got, _ := os.ReadFile(p)
	want, _ := os.ReadFile(src)
	if !bytes.Equal(got, want) {
		t.Errorf("%s holds %q, want %q", p, got, want)
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// Install over the real link: copied once, found the next time, a second
// version beside the first, the first pruned only when nothing runs it, a
// wrong file of the right name replaced; Uninstall leaves what runs and
// then removes everything.
func TestInstallForReal(t *testing.T) {
	c, _ := link(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "agent vm", "bin")
	src1, sum1 := fakeBinary(t, "1.2.3")

	inst, err := Install(ctx, c, src1, dir, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := Installed{Path: filepath.Join(dir, "agent-vm-"+sum1[:16]), SHA256: sum1, Copied: true}
	if inst != want {
		t.Fatalf("first install: %+v, want %+v", inst, want)
	}
	checkCopy(t, inst.Path, src1)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the directory Install made: %v %v, want 0700", fi, err)
	}
	if v, err := Version(ctx, c, inst.Path); err != nil || v != "agent-vm test 1.2.3" {
		t.Errorf("Version: %q, %v", v, err)
	}

	// Again: nothing copied, the file left as it was (its mtime set an
	// hour back first, so that a rewrite would show).
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(inst.Path, old, old); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(inst.Path)
	again, err := Install(ctx, c, src1, dir, time.Hour)
	if err != nil || again != (Installed{Path: inst.Path, SHA256: sum1}) {
		t.Fatalf("second install: %+v, %v; want it found, not copied", again, err)
	}
	if after, err := os.Stat(inst.Path); err != nil || !after.ModTime().Equal(old) || !os.SameFile(before, after) {
		t.Errorf("the copy found in place was touched: %v, %v (mtime was %v)", after, err, old)
	}

	// A second version goes beside the first, which was installed less
	// than keep ago and stays.
	src2, sum2 := fakeBinary(t, "2.0.0")
	inst2, err := Install(ctx, c, src2, dir, time.Hour)
	if err != nil || !inst2.Copied || inst2.Path != filepath.Join(dir, "agent-vm-"+sum2[:16]) {
		t.Fatalf("second version: %+v, %v", inst2, err)
	}
	checkCopy(t, inst2.Path, src2)
	if !exists(inst.Path) {
		t.Errorf("the first version was removed though installed less than keep ago")
	}

	// With keep 0 the first goes, but not while a process runs it.
	stop := running(t, inst.Path)
	if got, err := Install(ctx, c, src2, dir, 0); err != nil || got.Copied {
		t.Fatalf("install while the first runs: %+v, %v", got, err)
	}
	if !exists(inst.Path) {
		t.Fatalf("the first version was removed while a process ran it")
	}
	stop()
	if _, err := Install(ctx, c, src2, dir, 0); err != nil {
		t.Fatal(err)
	}
	if exists(inst.Path) || !exists(inst2.Path) {
		t.Errorf("after pruning: first there %v (want false), second there %v (want true)", exists(inst.Path), exists(inst2.Path))
	}

	// A file of the right name with the wrong content is replaced.
	src3, sum3 := fakeBinary(t, "3.0.0")
	wrong := filepath.Join(dir, "agent-vm-"+sum3[:16])
	if err := os.WriteFile(wrong, []byte("not agent-vm\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	inst3, err := Install(ctx, c, src3, dir, time.Hour)
	if err != nil || inst3 != (Installed{Path: wrong, SHA256: sum3, Copied: true}) {
		t.Fatalf("over a wrong file: %+v, %v", inst3, err)
	}
	checkCopy(t, inst3.Path, src3)

	// Uninstall leaves the copy a process runs, and the directory with it;
	// it removes the other copies and an upload's leftover.
	leftover := filepath.Join(dir, ".agent-vm-"+sum1[:16]+".0123456789abcdef.tmp")
	if err := os.WriteFile(leftover, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	stop = running(t, inst2.Path)
	if err := Uninstall(ctx, c, dir); err != nil {
		t.Fatal(err)
	}
	if !exists(inst2.Path) || exists(inst3.Path) || exists(leftover) {
		t.Errorf("uninstall while one runs: running one there %v (want true), other there %v, leftover there %v (want false)", exists(inst2.Path), exists(inst3.Path), exists(leftover))
	}
	stop()
	if err := Uninstall(ctx, c, dir); err != nil {
		t.Fatal(err)
	}
	if exists(dir) {
		des, _ := os.ReadDir(dir)
		t.Errorf("the directory is still there after uninstall, with %v", des)
	}
	if err := Uninstall(ctx, c, dir); err != nil {
		t.Errorf("uninstall of what is gone: %v", err)
	}
}

// What Install refuses, each error naming the input and the host.
func TestInstallRefusals(t *testing.T) {
	c, addr := link(t)
	ctx := context.Background()
	src, sum := fakeBinary(t, "1.2.3")
	base := t.TempDir()

	target := filepath.Join(base, "real dir")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	symlink := filepath.Join(base, "link dir")
	if err := os.Symlink(target, symlink); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(base, "open dir")
	if err := os.Mkdir(open, 0o700); err != nil || os.Chmod(open, 0o777) != nil {
		t.Fatal(err)
	}
	blocked := filepath.Join(base, "blocked dir")
	if err := os.MkdirAll(filepath.Join(blocked, "agent-vm-"+sum[:16]), 0o700); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(base, "no such", "agent-vm")

	for _, tc := range []struct {
		name, src, dir string
		want           []string
	}{
		{"symlink", src, symlink, []string{symlink, addr, "symbolic link", "hint:"}},
		{"relative", src, "agent vm/bin", []string{"agent vm/bin", addr, "not an absolute path", "hint:"}},
		{"writable by others", src, open, []string{open, addr, "writable by others", "hint:"}},
		{"not a regular file there", src, blocked, []string{filepath.Join(blocked, "agent-vm-"+sum[:16]), addr, "not a regular file", "hint:"}},
		{"no source", missing, filepath.Join(base, "unused"), []string{missing}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst, err := Install(ctx, c, tc.src, tc.dir, time.Hour)
			if err == nil {
				t.Fatalf("installed %+v", inst)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if des, _ := os.ReadDir(target); len(des) != 0 {
		t.Errorf("something was written through the symbolic link: %v", des)
	}
	if err := Uninstall(ctx, c, symlink); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("uninstall through a symbolic link: %v", err)
	}
	if exists(filepath.Join(base, "unused")) {
		t.Errorf("a directory was made for a source that is not there")
	}
}

// Version's failure names the command and what the host said.
func TestVersionFailure(t *testing.T) {
	c, addr := link(t)
	p := filepath.Join(t.TempDir(), "no agent-vm")
	_, err := Version(context.Background(), c, p)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "hint:") {
		t.Errorf("Version of a missing binary: %v", err)
	}
}
