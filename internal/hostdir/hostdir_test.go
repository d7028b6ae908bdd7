package hostdir

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// withUmask runs the rest of the test under umask (process-wide: these
// tests do not run in parallel).
func withUmask(t *testing.T, umask int) {
	old := syscall.Umask(umask)
	t.Cleanup(func() { syscall.Umask(old) })
}

func checkDir(t *testing.T, path string, mode fs.FileMode, uid int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	if !fi.IsDir() || fi.Mode().Perm() != mode {
		t.Errorf("%s: mode %v, want a directory with %04o", path, fi.Mode(), mode)
	}
	if got := int(fi.Sys().(*syscall.Stat_t).Uid); got != uid {
		t.Errorf("%s: owner uid %d, want %d", path, got, uid)
	}
}

// Each level gets its own mode, whatever the umask; missing ancestors get
// their Place's.
func TestModesWhateverTheUmask(t *testing.T) {
	for _, umask := range []int{0o077, 0o002, 0} {
		for _, place := range []Place{InXDG, InSystem} {
			withUmask(t, umask)
			base := t.TempDir()
			top := Top(filepath.Join(base, "a", "b", "agent-vm"), 0o711, place)
			images := top.Sub("images", 0o755)
			tmpl := top.Sub("templates", 0o700).Sub("x", 0o700)
			for _, d := range []*Dir{images, tmpl} {
				if err := d.Make(); err != nil {
					t.Fatalf("umask %04o: %v", umask, err)
				}
			}
			above := fs.FileMode(0o700)
			if place == InSystem {
				above = 0o755
			}
			me := os.Geteuid()
			checkDir(t, filepath.Join(base, "a"), above, me)
			checkDir(t, filepath.Join(base, "a", "b"), above, me)
			checkDir(t, top.Path, 0o711, me)
			checkDir(t, images.Path, 0o755, me)
			checkDir(t, tmpl.Parent.Path, 0o700, me)
			checkDir(t, tmpl.Path, 0o700, me)
		}
	}
}

// A level made with another mode (an older agent-vm, another command
// first) is set to its own; an ancestor is never changed; Allow's bits
// stay when set.
func TestExistingModesAreRepaired(t *testing.T) {
	base := t.TempDir()
	parent := filepath.Join(base, "lib")
	top := Top(filepath.Join(parent, "agent-vm"), 0o711, InSystem)
	reg := top.Sub("state-dirs", 0o700)
	for p, mode := range map[string]fs.FileMode{parent: 0o750, top.Path: 0o700, reg.Path: 0o755} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
	}
	if err := reg.Make(); err != nil {
		t.Fatal(err)
	}
	me := os.Geteuid()
	checkDir(t, parent, 0o750, me)
	checkDir(t, top.Path, 0o711, me)
	checkDir(t, reg.Path, 0o700, me)

	state := &Dir{Path: filepath.Join(base, "state"), Mode: 0o700, Allow: 0o001}
	for _, c := range []struct{ had, want fs.FileMode }{{0o701, 0o701}, {0o755, 0o701}, {0o770, 0o700}} {
		os.Mkdir(state.Path, 0o700)
		os.Chmod(state.Path, c.had)
		if err := state.Make(); err != nil {
			t.Fatal(err)
		}
		checkDir(t, state.Path, c.want, me)
	}
}

// Another user's directory is used as it is when its mode is right, and
// refused, naming it and the fix, when it would have to change; in a
// shared place it is refused either way.
func TestAnotherUsersDirectory(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "chown needs root")
	base := t.TempDir()
	theirs := filepath.Join(base, "theirs")
	if err := os.Mkdir(theirs, 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chmod(theirs, 0o711)
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := Top(theirs, 0o711, InSystem).Make(); err != nil {
		t.Errorf("another user's directory with the right mode: %v", err)
	}
	err := Top(theirs, 0o700, InSystem).Make()
	if err == nil || !strings.Contains(err.Error(), theirs) || !strings.Contains(err.Error(), "uid 65534") || !strings.Contains(err.Error(), "hint:") {
		t.Errorf("another user's directory with another mode: %v; want an error naming it, its owner and the fix", err)
	}
	checkDir(t, theirs, 0o711, 65534)
	shared := Top(theirs, 0o711, InSystem)
	shared.Shared = true
	if err := shared.Make(); err == nil || !strings.Contains(err.Error(), theirs) {
		t.Errorf("another user's directory in a shared place: %v; want refused", err)
	}
}

// In a shared place a directory others can write to, or a symlink, is
// refused even when it is this user's; elsewhere the mode is repaired.
func TestSharedPlacesAreStrict(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "agent-vm-egress")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	d := Top(dir, 0o711, InSystem)
	d.Shared = true
	vm := d.Sub("0123456789ab", 0o711)
	if err := vm.Make(); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("a world-writable shared directory: %v; want refused", err)
	}
	if _, err := os.Stat(vm.Path); err == nil {
		t.Errorf("%s was made in a refused directory", vm.Path)
	}
	if err := Top(dir, 0o711, InSystem).Make(); err != nil {
		t.Errorf("the same directory, not shared: %v", err)
	}
	checkDir(t, dir, 0o711, os.Geteuid())

	target := filepath.Join(base, "elsewhere")
	os.Mkdir(target, 0o711)
	link := filepath.Join(base, "link")
	os.Symlink(target, link)
	l := Top(link, 0o711, InSystem)
	if err := l.Make(); err != nil {
		t.Errorf("a symlink to a directory, not shared: %v", err)
	}
	l.Shared = true
	if err := l.Make(); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("a symlink in a shared place: %v; want refused", err)
	}
}

func TestNotADirectory(t *testing.T) {
	p := filepath.Join(t.TempDir(), "agent-vm")
	os.WriteFile(p, nil, 0o600)
	if err := Top(p, 0o700, InXDG).Make(); err == nil || !strings.Contains(err.Error(), p+" is a file") {
		t.Errorf("got %v, want an error saying %s is a file", err, p)
	}
}

// MakeFor gives what it creates, ancestors included, and the levels of
// this process's user to the owner (root writing into a user's cache).
func TestMakeForGivesToTheOwner(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "chown needs root")
	home := filepath.Join(t.TempDir(), "home")
	os.Mkdir(home, 0o755)
	os.Chown(home, 1001, 1001)
	cache := Top(filepath.Join(home, ".cache", "agent-vm"), 0o711, InXDG)
	images := cache.Sub("images", 0o755)
	if err := os.MkdirAll(images.Path, 0o700); err != nil { // root's, as an older agent-vm under sudo left them
		t.Fatal(err)
	}
	os.Chown(filepath.Dir(cache.Path), 1001, 1001)
	if err := images.MakeFor(Owner{UID: 1001, GID: 1001}); err != nil {
		t.Fatal(err)
	}
	checkDir(t, filepath.Dir(cache.Path), 0o700, 1001)
	checkDir(t, cache.Path, 0o711, 1001)
	checkDir(t, images.Path, 0o755, 1001)

	fresh := Top(filepath.Join(home, "new", "agent-vm"), 0o711, InXDG).Sub("images", 0o755)
	if err := fresh.MakeFor(Owner{UID: 1001, GID: 1001}); err != nil {
		t.Fatal(err)
	}
	checkDir(t, filepath.Join(home, "new"), 0o700, 1001)
	checkDir(t, fresh.Path, 0o755, 1001)
}

func TestInternalErrors(t *testing.T) {
	base := t.TempDir()
	for _, d := range []*Dir{
		{Path: filepath.Join(base, "x")},
		{Path: filepath.Join(base, "x"), Mode: 0o4755},
		{Path: filepath.Join(base, "x", "y", "z"), Mode: 0o700, Parent: Top(filepath.Join(base, "x"), 0o700, InXDG)},
	} {
		if err := d.Make(); err == nil || !strings.HasPrefix(err.Error(), "internal error") {
			t.Errorf("%+v: got %v, want an internal error", d, err)
		}
	}
}
