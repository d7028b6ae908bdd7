// Package guestram moves the guest memory of a stopped QEMU to a file on
// disk and back, so that a VM kept paused in place costs the host its
// QEMU's own memory only, not the guest's.
//
// A QEMU VM's RAM is a shared memfd (memory-backend-memfd,share=on, which
// vhost-user's virtiofsd maps too). While QMP `stop` holds its CPUs and
// its devices (vhost-user ones included) are stopped, nothing reads or
// writes that memory, so Save copies the memfd's pages that hold data to a
// sparse file, syncs it and drops its page cache, and then punches the
// memfd empty: the host gets those pages back, from QEMU's mapping and
// virtiofsd's alike, and the process, its devices, its virtiofs mount and
// every guest process using it stay as they were. Restore writes the
// file's data back into the memfd at the same offsets before `cont`;
// what was a hole reads as zeros, as it did before (a block of zeros is
// not copied). This is what makes a VM whose workspace is in use
// hibernate on QEMU 7.2, whose vhost-user-fs device cannot be saved by a
// migration.
//
// The memfd is reached through /proc/PID/fd, which needs the rights to
// read QEMU's file table: the same user as an unprivileged QEMU, or root
// for one under -runas.
package guestram

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// memfdName is how QEMU names the memfd of a memory-backend-memfd (its
// type name), as /proc/PID/fd's link shows it.
const memfdName = "/memfd:memory-backend-memfd"

// block is the unit of copying, and of telling zeros from data.
const block = 1 << 20

// Open opens the guest memory of QEMU pid: its memory-backend-memfd of
// size bytes (the VM's -m). None, or more than one of that size, is an
// error: that QEMU's memory is not one agent-vm can move.
func Open(pid int, size int64) (*os.File, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading QEMU's open files (%s): %w", dir, err)
	}
	var found *os.File
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		link, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(link, memfdName) {
			continue
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("opening QEMU's guest memory (%s): %w", p, err)
		}
		fi, err := f.Stat()
		if err != nil || fi.Size() != size {
			f.Close()
			continue
		}
		if found != nil {
			same, _ := found.Stat()
			f.Close()
			if same != nil && os.SameFile(same, fi) { // another descriptor of it
				continue
			}
			found.Close()
			return nil, fmt.Errorf("QEMU (pid %d) has more than one memory file of %d bytes: not one agent-vm made", pid, size)
		}
		found = f
	}
	if found == nil {
		return nil, fmt.Errorf("QEMU (pid %d) has no shared memory file of %d bytes (its RAM is not a memory-backend-memfd of the VM's size)", pid, size)
	}
	return found, nil
}

// Save copies mem's data to a new file at path (mode 0600; one there is
// replaced), syncs it, and returns how many bytes of data it holds. mem
// is not changed: Release does that once the caller has recorded that
// the memory is in path. A Save that fails removes what it wrote.
func Save(mem *os.File, path string) (n int64, err error) {
	size, err := sizeOf(mem)
	if err != nil {
		return 0, err
	}
	tmp := path + ".part"
	out, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("saving the guest's memory: %w", err)
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(tmp)
		}
	}()
	if err := out.Truncate(size); err != nil {
		return 0, fmt.Errorf("saving the guest's memory to %s: %w", tmp, err)
	}
	n, err = copyData(out, mem, size)
	if err != nil {
		return 0, fmt.Errorf("saving the guest's memory to %s: %w", tmp, err)
	}
	if err := out.Sync(); err != nil {
		return 0, fmt.Errorf("saving the guest's memory to %s: %w", tmp, err)
	}
	// The copy is on disk; its pages in the host's cache would only hold
	// the memory Release gives back.
	_ = unix.Fadvise(int(out.Fd()), 0, 0, unix.FADV_DONTNEED)
	if err := out.Close(); err != nil {
		return 0, fmt.Errorf("saving the guest's memory to %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("saving the guest's memory: %w", err)
	}
	return n, nil
}

// Release empties mem (punches it whole), giving its pages back to the
// host; every mapping of it reads zeros until Restore.
func Release(mem *os.File) error {
	size, err := sizeOf(mem)
	if err != nil {
		return err
	}
	if err := unix.Fallocate(int(mem.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, size); err != nil {
		return fmt.Errorf("giving the guest's memory back to the host: %w", err)
	}
	return nil
}

// Restore writes the data of the file at path (a Save of mem) back into
// mem at the same offsets. The file stays, and so do its pages in the
// host's cache: the caller removes it once the guest runs again, or keeps
// it for the next restore (a template's, for its next clone).
func Restore(mem *os.File, path string) error {
	in, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("restoring the guest's memory: %w", err)
	}
	defer in.Close()
	size, err := sizeOf(mem)
	if err != nil {
		return err
	}
	if fi, err := in.Stat(); err != nil || fi.Size() != size {
		return fmt.Errorf("restoring the guest's memory: %s is not a copy of a memory of %d bytes", path, size)
	}
	if _, err := copyData(mem, in, size); err != nil {
		return fmt.Errorf("restoring the guest's memory from %s: %w", path, err)
	}
	return nil
}

// Resident is how many bytes of mem are in host memory now (its blocks).
func Resident(mem *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(mem.Fd()), &st); err != nil {
		return 0, err
	}
	return st.Blocks * 512, nil
}

func sizeOf(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("the guest's memory: %w", err)
	}
	return fi.Size(), nil
}

// copyData copies src's data to dst at the same offsets, src's holes (as
// SEEK_DATA/SEEK_HOLE find them) and blocks of zeros skipped; it returns
// the bytes written.
func copyData(dst, src *os.File, size int64) (int64, error) {
	buf := make([]byte, block)
	zero := make([]byte, block)
	var n int64
	fd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data past off
			break
		}
		if err != nil {
			return n, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return n, err
		}
		for p := data; p < hole; p += block {
			b := buf[:min(block, hole-p)]
			if _, err := src.ReadAt(b, p); err != nil && !errors.Is(err, io.EOF) {
				return n, err
			}
			if bytes.Equal(b, zero[:len(b)]) {
				continue
			}
			if _, err := dst.WriteAt(b, p); err != nil {
				return n, err
			}
			n += int64(len(b))
		}
		off = hole
	}
	return n, nil
}
