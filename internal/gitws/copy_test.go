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
	old := fileStamp{Dev: 1, Ino: 2, Size: 3, Mtime: syscall.Timespec{Sec: 900}, Ctime: syscall.Timespec{Sec: 900}, Mode: 0o100644, UID: 4, GID: 5}
	young := old
	young.Ctime = syscall.Timespec{Sec: 999, Nsec: 500} // within stampSlack of the start
	c := &Copying{began: began, seen: map[string]fileStamp{"old": old, "young": young}}
	for _, tc := range []struct {
		rel  string
		now  func(fileStamp) fileStamp
		want bool
	}{
		{"old", func(s fileStamp) fileStamp { return s }, true},
		{"young", func(s fileStamp) fileStamp { return s }, false},
		{"never seen", func(s fileStamp) fileStamp { return s }, false},
		{"old", func(s fileStamp) fileStamp { s.Ino++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.Dev++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.Size++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.Mtime.Nsec++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.Ctime.Nsec++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.Mode ^= 0o100; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.UID++; return s }, false},
		{"old", func(s fileStamp) fileStamp { s.GID++; return s }, false},
	} {
		if got := c.unchanged(tc.rel, tc.now(old)); got != tc.want {
			t.Errorf("%s, %+v: unchanged %v, want %v", tc.rel, tc.now(old), got, tc.want)
		}
	}
}

// A copy given an earlier one (Reuse) links the files unchanged since,
// and copies the rest: also a file linked by Precopy that changes before
// Finish, whose new content goes into a file of the copy's own, never
// into the earlier copy's. The earlier copy stays as it was. A file that
// changed within the slack of the earlier copy's pass is never linked.
func TestCopyingLinksWhatAnEarlierCopyHolds(t *testing.T) {
	defer func(s time.Duration) { stampSlack = s }(stampSlack)
	stampSlack = -time.Hour // the stamps alone must tell the changes
	ctx := context.Background()
	ws := tu.Repo(t, false)
	for f, c := range map[string]string{"keep.txt": "keep\n", "edit.txt": "before\n", "late.txt": "late before\n",
		"chmod.sh": "#!/bin/sh\n", "gone.txt": "x\n", "dir/a.txt": "a\n"} {
		tu.WriteFile(t, filepath.Join(ws, f), c)
	}
	tmp := t.TempDir()
	first, stamps := filepath.Join(tmp, "first"), filepath.Join(tmp, "first.stamps")
	c1, err := New(execx.OS{}).NewCopying(ws, first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c1.WriteStamps(stamps); err != nil {
		t.Fatal(err)
	}

	// A tick of the coarse clock on, edit.txt gets content of the same size.
	time.Sleep(50 * time.Millisecond)
	tu.WriteFile(t, filepath.Join(ws, "edit.txt"), "after!\n")
	for _, step := range []error{
		os.Chmod(filepath.Join(ws, "chmod.sh"), 0o755),
		os.Remove(filepath.Join(ws, "gone.txt")),
		os.WriteFile(filepath.Join(ws, "new.txt"), []byte("new\n"), 0o644),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
	second := filepath.Join(tmp, "second")
	c2, err := New(execx.OS{}).NewCopying(ws, second)
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Reuse(first, stamps); err != nil {
		t.Fatal(err)
	}
	if err := c2.Precopy(ctx); err != nil {
		t.Fatal(err)
	}
	if linked(t, first, second, "late.txt") != true {
		t.Fatal("Precopy did not link late.txt, unchanged since the first copy")
	}
	time.Sleep(50 * time.Millisecond)
	tu.WriteFile(t, filepath.Join(ws, "late.txt"), "late after!\n")
	res, err := c2.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range sameTree(t, ws, second) {
		t.Error(d)
	}
	for rel, want := range map[string]bool{"keep.txt": true, "dir/a.txt": true, ".git/HEAD": true,
		"edit.txt": false, "late.txt": false, "chmod.sh": false, "new.txt": false} {
		if got := linked(t, first, second, rel); got != want {
			t.Errorf("%s linked to the first copy's: %v, want %v", rel, got, want)
		}
	}
	for rel, want := range map[string]string{"edit.txt": "before\n", "late.txt": "late before\n", "gone.txt": "x\n"} {
		if b, err := os.ReadFile(filepath.Join(first, rel)); err != nil || string(b) != want {
			t.Errorf("the first copy's %s is now %q (%v), want %q as it was", rel, b, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(first, "chmod.sh")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the first copy's chmod.sh: %v, %v, want mode 0644 as it was", fi.Mode(), err)
	}
	if res.Linked < 3 || res.Linked >= res.Files || res.LinkedBytes <= 0 {
		t.Errorf("linked %d of %d files (%d bytes), want the unchanged ones", res.Linked, res.Files, res.LinkedBytes)
	}

	// With the slack, files made just before the first copy's pass are
	// too young to link: their stamps could hide a change in that tick.
	stampSlack = 3 * time.Second
	c3, err := New(execx.OS{}).NewCopying(ws, filepath.Join(tmp, "third"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c3.Reuse(first, stamps); err != nil {
		t.Fatal(err)
	}
	if res, err := c3.Finish(ctx); err != nil || res.Linked != 0 {
		t.Errorf("linked %d files changed within the slack of the first copy (%v), want none", res.Linked, err)
	}

	// No stamps: nothing to reuse. Stamps that cannot be read: an error.
	c4, err := New(execx.OS{}).NewCopying(ws, filepath.Join(tmp, "fourth"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c4.Reuse(first, filepath.Join(tmp, "none")); err != nil || c4.base != nil {
		t.Errorf("Reuse without a stamps file: %v, base %v; want nothing to reuse", err, c4.base)
	}
	tu.WriteFile(t, filepath.Join(tmp, "bad.stamps"), "not gob")
	if err := c4.Reuse(first, filepath.Join(tmp, "bad.stamps")); err == nil || !strings.Contains(err.Error(), "bad.stamps") {
		t.Errorf("Reuse of a broken stamps file: %v, want an error naming it", err)
	}
}

// linked reports whether the copies a and b share their file rel.
func linked(t *testing.T, a, b, rel string) bool {
	t.Helper()
	fa, err := os.Lstat(filepath.Join(a, rel))
	if err != nil {
		return false
	}
	fb, err := os.Lstat(filepath.Join(b, rel))
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(fa, fb)
}
