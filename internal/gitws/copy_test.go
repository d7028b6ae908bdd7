package gitws

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	gosync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// sameTree reports how the tree at b differs from the tree at a: every
// entry's kind, permissions, time, content and link target.
func sameTree(t *testing.T, a, b string) []string {
	t.Helper()
	read := func(root string) map[string]string {
		out := map[string]string{}
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			fi, err := os.Lstat(path)
			if err != nil {
				return err
			}
			desc := fmt.Sprintf("%v %d", fi.Mode(), fi.ModTime().UnixNano())
			switch {
			case fi.Mode().IsRegular():
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				desc += " " + string(b)
			case fi.Mode()&fs.ModeSymlink != 0:
				target, _ := os.Readlink(path)
				desc = "link " + target
			case !fi.IsDir():
				desc = "skipped"
			}
			out[rel] = desc
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	want, got := read(a), read(b)
	var diffs []string
	for rel, w := range want {
		if g, ok := got[rel]; w != "skipped" && g != w {
			diffs = append(diffs, fmt.Sprintf("%s: %q (present %v), want %q", rel, g, ok, w))
		}
	}
	for rel := range got {
		if _, ok := want[rel]; !ok {
			diffs = append(diffs, rel+": in the copy, not in the workspace")
		}
	}
	return diffs
}

// A copy in two passes ends exactly as the workspace is at Finish,
// whatever changed between the passes (content of the same size, modes,
// kinds, links, entries made and removed, read-only directories), and
// Finish copies again only what changed: Precopy's copies of the rest
// stay (the same files). Once with a short slack, and once with none at
// all, where each file's stamp alone must tell the changes.
func TestCopyingCatchesUpWithWhatChanged(t *testing.T) {
	for _, slack := range []time.Duration{100 * time.Millisecond, -time.Hour} {
		t.Run(slack.String(), func(t *testing.T) { catchUp(t, slack) })
	}
}

func catchUp(t *testing.T, slack time.Duration) {
	defer func(s time.Duration) { stampSlack = s }(stampSlack)
	stampSlack = slack
	ctx := context.Background()
	ws := tu.Repo(t, false)
	files := map[string]string{
		"same.txt": "unchanged\n", "edit.txt": "before\n", "chmod.sh": "#!/bin/sh\n", "gone.txt": "x\n",
		"dir/a.txt": "a\n", "dir/sub/b.txt": "b\n", "kind/file-then-dir": "f\n", "ro/keep.txt": "k\n",
	}
	for f, c := range files {
		tu.WriteFile(t, filepath.Join(ws, f), c)
	}
	if err := os.Mkdir(filepath.Join(ws, "kind", "dir-then-file"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("same.txt", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)

	dest := filepath.Join(t.TempDir(), "copy")
	c, err := New(execx.OS{}).NewCopying(ws, dest)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Precopy(ctx); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(filepath.Join(dest, "same.txt"))
	if err != nil {
		t.Fatal(err)
	}

	// What the VM does between the passes, on a tick of the clock after
	// Precopy's (change times are the kernel's coarse clock's).
	time.Sleep(50 * time.Millisecond)
	tu.WriteFile(t, filepath.Join(ws, "edit.txt"), "after!\n") // the same size
	for _, step := range []error{
		os.Chmod(filepath.Join(ws, "chmod.sh"), 0o755),
		os.Remove(filepath.Join(ws, "gone.txt")),
		os.RemoveAll(filepath.Join(ws, "dir", "sub")),
		os.Remove(filepath.Join(ws, "kind", "file-then-dir")),
		os.Mkdir(filepath.Join(ws, "kind", "file-then-dir"), 0o750),
		os.Remove(filepath.Join(ws, "kind", "dir-then-file")),
		os.WriteFile(filepath.Join(ws, "kind", "dir-then-file"), []byte("now a file\n"), 0o644),
		os.Remove(filepath.Join(ws, "link")),
		os.Symlink("edit.txt", filepath.Join(ws, "link")),
		os.WriteFile(filepath.Join(ws, "new.txt"), []byte("new\n"), 0o600),
		os.Chmod(filepath.Join(ws, "ro"), 0o555),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(ws, "ro"), 0o755); _ = os.Chmod(filepath.Join(dest, "ro"), 0o755) })

	res, err := c.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range sameTree(t, ws, dest) {
		t.Error(d)
	}
	after, err := os.Stat(filepath.Join(dest, "same.txt"))
	if err != nil || !os.SameFile(before, after) {
		t.Errorf("same.txt was copied again (%v); Precopy's copy of a file unchanged since should stay", err)
	}
	// edit.txt, chmod.sh, kind/dir-then-file, new.txt; and the files
	// git's commit in tu.Repo wrote within the slack of Precopy.
	if res.Copied < 4 || res.Copied >= res.Files || (slack < 0 && res.Copied != 4) {
		t.Errorf("Finish copied %d of %d files again, want the 4 that changed (and those too young to trust)", res.Copied, res.Files)
	}
	if len(res.Skipped) != 1 || res.Skipped[0] != "fifo" {
		t.Errorf("skipped %q, want the FIFO", res.Skipped)
	}
}

// Precopy runs while the workspace changes under it (files and
// directories made and removed as it walks), and Finish, once it is
// still, makes the copy exactly the workspace.
func TestCopyingAWorkspaceInUse(t *testing.T) {
	ctx := context.Background()
	ws := tu.Repo(t, false)
	for i := range 40 {
		tu.WriteFile(t, filepath.Join(ws, fmt.Sprintf("d%d", i%8), fmt.Sprintf("f%d", i)), strings.Repeat("x", i*100))
	}
	stop := make(chan struct{})
	var wg gosync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			d := filepath.Join(ws, fmt.Sprintf("d%d", i%8))
			_ = os.RemoveAll(d)
			_ = os.MkdirAll(filepath.Join(d, "deep"), 0o755)
			_ = os.WriteFile(filepath.Join(d, "deep", "f"), bytes.Repeat([]byte{byte(i)}, i%5000), 0o644)
			_ = os.WriteFile(filepath.Join(ws, "churn"), []byte(fmt.Sprint(i)), 0o644)
		}
	}()
	dest := filepath.Join(t.TempDir(), "copy")
	var c *Copying
	for range 5 { // each pass walks a tree that changes under it
		_ = os.RemoveAll(dest)
		var err error
		if c, err = New(execx.OS{}).NewCopying(ws, dest); err != nil {
			t.Fatal(err)
		}
		if err := c.Precopy(ctx); err != nil {
			t.Fatalf("Precopy of a workspace in use: %v", err)
		}
	}
	close(stop)
	wg.Wait()
	if _, err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range sameTree(t, ws, dest) {
		t.Error(d)
	}
}

// An interrupt stops a pass and removes what it copied.
func TestCopyingInterrupted(t *testing.T) {
	ws := tu.Repo(t, false)
	dest := filepath.Join(t.TempDir(), "copy")
	c, err := New(execx.OS{}).NewCopying(ws, dest)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Precopy(ctx); err == nil {
		t.Error("Precopy went on after an interrupt")
	}
	if _, err := c.Finish(ctx); err == nil {
		t.Error("Finish went on after an interrupt")
	}
	if _, err := os.Lstat(dest); err == nil {
		t.Errorf("an interrupted copy left %s", dest)
	}
}

// Finish trusts Precopy's copy of a file only when the file is the one
// it copied, with every attribute as it was, and last changed well before
// Precopy began.
func TestCopyingTrustsOnlyOldUnchangedFiles(t *testing.T) {
	began := time.Unix(1000, 0)
	old := fileStamp{dev: 1, ino: 2, size: 3, mtime: syscall.Timespec{Sec: 900}, ctime: syscall.Timespec{Sec: 900}, mode: 0o100644, uid: 4, gid: 5}
	young := old
	young.ctime = syscall.Timespec{Sec: 999, Nsec: 500} // within stampSlack of the start
	c := &Copying{began: began, seen: map[string]fileStamp{"old": old, "young": young}}
	for _, tc := range []struct {
		rel  string
		now  func(fileStamp) fileStamp
		want bool
	}{
		{"old", func(s fileStamp) fileStamp { return s }, true},
		{"young", func(s fileStamp) fileStamp { return s }, false},
		{"never seen", func(s fileStamp) fileStamp { return s }, false},
		{"old", func(s fileStamp) fileStamp { s.ino++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.dev++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.size++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.mtime.Nsec++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.ctime.Nsec++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.mode ^= 0o100; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.uid++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.gid++; return s }, false},
	} {
		if got := c.unchanged(tc.rel, tc.now(old)); got != tc.want {
			t.Errorf("%s, %+v: unchanged %v, want %v", tc.rel, tc.now(old), got, tc.want)
		}
	}
}
