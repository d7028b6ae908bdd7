// Package hostdir makes the directories agent-vm keeps on the host (the
// state directory, root's /var/lib/agent-vm, the cache, the egress
// sockets' directory in /run) with the mode each must have, whichever
// command gets to make them first.
//
// A directory is a Dir: its path, its mode and the directory of
// agent-vm's it lies in (Parent), up to a top directory, above which
// nothing is agent-vm's. Make walks that chain from the top down:
//
//   - A level it creates gets exactly its mode, whatever the umask.
//   - A level that exists with another mode (an older agent-vm made it, or
//     another command made it with the mode it wanted for itself) is set
//     to the wanted mode if it belongs to this user. One of another user's
//     is left alone when its mode is right and is an error otherwise: the
//     path, whose it is and what to do.
//   - A level marked Shared lies where other users can make files (/tmp,
//     or a directory /run might be replaced by): it must be this user's and
//     not writable by group or others, or it is refused, since someone
//     else may have made it first or put files in it. It is never followed
//     when it is a symlink.
//   - The ancestors above the top are not agent-vm's: they are never
//     changed when they exist. Missing ones are created as the top's Place
//     says: 0700 in a user's own places (the XDG base directory spec asks
//     for that when it creates a base directory), 0755 in system places
//     (/var/lib, /run, a path an administrator named), as the system and
//     `mkdir -p` make them, because a top there is meant to be passed
//     through by other users (libvirt's QEMU, a workspace's owner) and a
//     0700 ancestor would stop them. Creating rather than refusing keeps
//     what agent-vm did so far for paths set in AGENT_VM_* variables.
//
// MakeFor does the same for another user (root writing into a user's
// cache under sudo): what it creates, and the levels this process owns, are
// given to that user.
//
// Errors are lowercase and name the path. A refusal says what to do; a
// failure to create (permission denied) does not, since only the caller
// knows which setting chooses the place.
//
// Which directories agent-vm keeps, with the mode each must have and why,
// is one table (Table, table.go): each package that makes one of them is
// handed its entry, so no package picks a mode on its own.
package hostdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Place is where a top directory lies; it decides how Make creates the
// missing ancestors, which are not agent-vm's.
type Place uint8

const (
	// InXDG is a place of the user's own: an XDG base directory
	// ($XDG_CACHE_HOME, $XDG_STATE_HOME, $XDG_RUNTIME_DIR) or a path the
	// user chose for their VMs. Missing ancestors are made 0700.
	InXDG Place = iota
	// InSystem is a system place (/var/lib, /run, /tmp, a path set in an
	// AGENT_VM_* variable for libvirt's QEMU). Missing ancestors are made
	// 0755.
	InSystem
)

func (p Place) mode() fs.FileMode {
	if p == InSystem {
		return 0o755
	}
	return 0o700
}

// Dir is a directory of agent-vm's on the host and how it must be.
type Dir struct {
	Path string
	// Mode is its permission bits (0o700, 0o711, 0o755).
	Mode fs.FileMode
	// Allow are permission bits an existing directory may have beyond
	// Mode, left as they are: another part of agent-vm adds them on
	// purpose (the vagrant driver lets libvirt's QEMU through a state
	// directory with o+x).
	Allow fs.FileMode
	// Shared: it lies where other users may make it first or write into
	// it (see the package doc). Sub passes it on.
	Shared bool
	// Parent is the directory of agent-vm's that Path lies directly in;
	// nil for a top directory.
	Parent *Dir
	// Place, for a top directory, says how its missing ancestors are made.
	Place Place
}

// Top is a top directory: nothing above path is agent-vm's.
func Top(path string, mode fs.FileMode, place Place) *Dir {
	return &Dir{Path: path, Mode: mode, Place: place}
}

// Sub is the directory name, with mode, in d. It is Shared when d is.
func (d *Dir) Sub(name string, mode fs.FileMode) *Dir {
	return &Dir{Path: filepath.Join(d.Path, name), Mode: mode, Shared: d.Shared, Parent: d}
}

// Owner is the user MakeFor gives directories to.
type Owner struct{ UID, GID int }

// Make makes d and the levels above it, as this process's user.
func (d *Dir) Make() error { return d.make(nil) }

// MakeFor makes d and the levels above it for o: what it creates, and the
// levels that are this process's, become o's (see the package doc).
func (d *Dir) MakeFor(o Owner) error { return d.make(&o) }

func (d *Dir) make(o *Owner) error {
	chain, err := d.chain()
	if err != nil {
		return err
	}
	if err := makeAncestors(filepath.Dir(chain[0].Path), chain[0].Place.mode(), o); err != nil {
		return err
	}
	for _, l := range chain {
		if err := l.makeLevel(o); err != nil {
			return err
		}
	}
	return nil
}

// chain is d's levels, the top first.
func (d *Dir) chain() ([]*Dir, error) {
	var out []*Dir
	for l := d; l != nil; l = l.Parent {
		if l.Path == "" || l.Mode == 0 || l.Mode&^fs.ModePerm != 0 || l.Allow&^fs.ModePerm != 0 {
			return nil, fmt.Errorf("internal error: directory %q with mode %v", l.Path, l.Mode)
		}
		if l.Parent != nil && filepath.Dir(filepath.Clean(l.Path)) != filepath.Clean(l.Parent.Path) {
			return nil, fmt.Errorf("internal error: %s does not lie in %s", l.Path, l.Parent.Path)
		}
		out = append([]*Dir{l}, out...)
	}
	return out, nil
}

// makeAncestors creates what is missing of dir and above it with mode;
// what exists is left as it is.
func makeAncestors(dir string, mode fs.FileMode, o *Owner) error {
	var missing []string
	for p := dir; ; p = filepath.Dir(p) {
		_, err := os.Stat(p)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("making directory %s: %w", p, err)
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if _, err := create(missing[i], mode, o); err != nil {
			return err
		}
	}
	return nil
}

// create makes dir with exactly mode, given to o when set. made is false
// when dir was there already (another process made it meanwhile, or it
// is not a directory: the caller looks).
func create(dir string, mode fs.FileMode, o *Owner) (made bool, err error) {
	if err := os.Mkdir(dir, mode); errors.Is(err, fs.ErrExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("making directory %s: %w", dir, err)
	}
	// Mkdir's mode went through the umask.
	if err := os.Chmod(dir, mode); err != nil {
		return true, fmt.Errorf("setting the mode of %s: %w", dir, err)
	}
	if o != nil {
		if err := os.Lchown(dir, o.UID, o.GID); err != nil {
			return true, fmt.Errorf("giving %s to uid %d: %w", dir, o.UID, err)
		}
	}
	return true, nil
}

// makeLevel makes the one directory d, or brings the existing one to d's
// mode (and o's ownership) where it may.
func (d *Dir) makeLevel(o *Owner) error {
	made, err := create(d.Path, d.Mode, o)
	if made || err != nil {
		return err
	}
	stat := os.Stat
	if d.Shared {
		stat = os.Lstat
	}
	fi, err := stat(d.Path)
	if err != nil {
		return fmt.Errorf("making directory %s: %w", d.Path, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is a %s, where agent-vm keeps a directory (hint: move it away)", d.Path, kind(fi.Mode()))
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("internal error: no owner for %s", d.Path)
	}
	uid, euid := int(st.Uid), os.Geteuid()
	want := euid
	if o != nil {
		want = o.UID
	}
	perm := fi.Mode().Perm()
	right := perm|d.Allow == d.Mode|d.Allow
	mine := uid == want || uid == euid
	switch {
	case !mine && d.Shared:
		return fmt.Errorf("%s belongs to uid %d, not to uid %d, and lies where other users can make it (hint: remove it; agent-vm makes it anew)", d.Path, uid, want)
	case !mine && !right:
		return fmt.Errorf("%s has mode %04o, not %04o, and belongs to uid %d, not to uid %d, so agent-vm does not change it (hint: `chmod %04o %s` as its owner, or remove it)", d.Path, perm, d.Mode, uid, want, d.Mode, d.Path)
	case !mine:
		return nil // right as it is: another user's directory agent-vm only uses
	case d.Shared && perm&0o022 != 0:
		return fmt.Errorf("%s has mode %04o: other users can write to it and may have put files in it (hint: remove it; agent-vm makes it anew)", d.Path, perm)
	}
	if !right {
		if err := os.Chmod(d.Path, d.Mode|perm&d.Allow); err != nil {
			return fmt.Errorf("setting the mode of %s to %04o: %w", d.Path, d.Mode, err)
		}
	}
	if o != nil && uid != o.UID {
		if err := os.Chown(d.Path, o.UID, o.GID); err != nil {
			return fmt.Errorf("giving %s to uid %d: %w", d.Path, o.UID, err)
		}
	}
	return nil
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsRegular():
		return "file"
	}
	return "special file"
}
