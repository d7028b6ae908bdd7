package guestram

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

const size = 16 << 20

// memfd makes a memfd named as QEMU names its guest memory, of n bytes,
// in this process (what Open finds through /proc/self/fd).
func memfd(t *testing.T, name string, n int64) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), name)
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(n); err != nil {
		t.Fatal(err)
	}
	return f
}

// fill writes a guest's memory: random data in some blocks, a block of
// zeros that was written (data, yet all zero), a page in another block,
// and holes elsewhere.
func fill(t *testing.T, f *os.File) []byte {
	t.Helper()
	want := make([]byte, size)
	if _, err := rand.Read(want[0 : 3*block]); err != nil {
		t.Fatal(err)
	}
	copy(want[5*block+4096:], "a page of its own")
	if _, err := rand.Read(want[size-block : size]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(want[:6*block], 0); err != nil { // blocks 3 and 4 are written zeros
		t.Fatal(err)
	}
	if _, err := f.WriteAt(want[size-block:], size-block); err != nil {
		t.Fatal(err)
	}
	return want
}

func content(t *testing.T, f *os.File) []byte {
	t.Helper()
	got := make([]byte, size)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestSaveReleaseRestore(t *testing.T) {
	dir := t.TempDir()
	mem := memfd(t, "memory-backend-memfd", size)
	want := fill(t, mem)
	opened, err := Open(os.Getpid(), size)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer opened.Close()
	before, _ := Resident(opened)
	path := filepath.Join(dir, "memory.ram")
	n, err := Save(opened, path)
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	// Blocks 0-2, 5 and the last hold data; 3 and 4 are zeros, not copied.
	if n != 5*block {
		t.Errorf("Save wrote %d bytes of data, want %d", n, 5*block)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != size {
		t.Errorf("the file: %v, %v", fi, err)
	}
	if _, err := os.Stat(path + ".part"); !os.IsNotExist(err) {
		t.Errorf("a part file is left: %v", err)
	}
	if !bytes.Equal(content(t, mem), want) {
		t.Fatal("Save changed the memory")
	}
	if err := Release(opened); err != nil {
		t.Fatalf("Release: %v", err)
	}
	after, _ := Resident(mem)
	if before < 5*block || after != 0 {
		t.Errorf("resident before %d, after Release %d: want it all given back", before, after)
	}
	if !bytes.Equal(content(t, mem), make([]byte, size)) {
		t.Fatal("the released memory does not read as zeros")
	}
	if err := Restore(opened, path); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if !bytes.Equal(content(t, mem), want) {
		t.Fatal("the restored memory differs from what was saved")
	}
	// A Restore over memory that was never released (a crash between
	// recording the file and Release) leaves it as it was.
	if err := Restore(opened, path); err != nil || !bytes.Equal(content(t, mem), want) {
		t.Fatalf("a second Restore: %v", err)
	}
}

func TestOpenRefusals(t *testing.T) {
	if _, err := Open(os.Getpid(), size); err == nil || !strings.Contains(err.Error(), "has no shared memory file of") {
		t.Errorf("no memfd: %v", err)
	}
	memfd(t, "memory-backend-memfd", size/2)
	if _, err := Open(os.Getpid(), size); err == nil || !strings.Contains(err.Error(), "has no shared memory file of") {
		t.Errorf("one of another size: %v", err)
	}
	memfd(t, "something-else", size)
	if _, err := Open(os.Getpid(), size); err == nil {
		t.Error("a memfd of another name was taken for the guest's memory")
	}
	memfd(t, "memory-backend-memfd", size)
	memfd(t, "memory-backend-memfd", size)
	if _, err := Open(os.Getpid(), size); err == nil || !strings.Contains(err.Error(), "more than one") {
		t.Errorf("two: %v", err)
	}
	if _, err := Open(1<<30, size); err == nil || !strings.Contains(err.Error(), "reading QEMU's open files") {
		t.Errorf("no such process: %v", err)
	}
}

func TestRestoreRefusesAnotherFile(t *testing.T) {
	mem := memfd(t, "memory-backend-memfd", size)
	path := filepath.Join(t.TempDir(), "memory.ram")
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Restore(mem, path); err == nil || !strings.Contains(err.Error(), "is not a copy of a memory of") {
		t.Errorf("a file of another size: %v", err)
	}
	if err := Restore(mem, path+".gone"); err == nil {
		t.Error("a missing file was restored")
	}
}

// A disk that fills during Save leaves no file and the memory whole.
func TestSaveOnAFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		tu.SkipOrFail(t, "mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		tu.SkipOrFail(t, "cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	mem := memfd(t, "memory-backend-memfd", size)
	want := fill(t, mem)
	path := filepath.Join(dir, "memory.ram")
	if _, err := Save(mem, path); err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("Save on a full disk: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
	if !bytes.Equal(content(t, mem), want) {
		t.Error("a failed Save changed the memory")
	}
}
