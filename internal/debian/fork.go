package debian

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/seed"
	"github.com/agent-vm/agent-vm/internal/state"
)

var _ backend.Forker = (*Backend)(nil)

// ForkDisk implements backend.Forker: the fork's overlay is a copy of the
// source's, on the same base (and template disk, if any), and its
// disk.json the source's. Its guest is the source's until the fork's first
// start: that start boots it as the source's instance (Settings.Adopt),
// logs in with the source's keys, which the fork keeps until then in
// AdoptDir (the source may be gone by that time), and gives it the fork's
// host key, login key, hostname, machine-id and token (Prepare's
// Plan.Adopt). A copy for a checkpoint of the same VM (nr has r's id)
// keeps no keys: it is that VM already.
func (b *Backend) ForkDisk(ctx context.Context, from state.Layout, r *state.Record, to state.Layout, nr *state.Record) (backend.DiskFork, error) {
	s, err := state.SectionOf[Settings](r)
	if err != nil {
		return backend.DiskFork{}, err
	}
	if s.Template {
		return backend.DiskFork{}, fmt.Errorf("%q is a template's VM, which is not forked (hint: fork a VM started from it)", r.Branch)
	}
	raw, info, err := diskOf(from, fmt.Sprintf("%q's disk", r.Branch), "so its disk cannot be read (hint: put it back)")
	if err != nil {
		return backend.DiskFork{}, err
	}
	if info == nil {
		return backend.DiskFork{}, nr.SetSection(s) // never started: the fork makes its own disk at its first start
	}
	if nr.ID != r.ID && !s.Forked {
		if err := adoptKeys(from, r, &s, to); err != nil {
			return backend.DiskFork{}, err
		}
	}
	overlay := filepath.Join(to.Dir, DiskFile)
	n, err := image.CopyOverlay(ctx, b.Run, filepath.Join(from.Dir, DiskFile), overlay, false)
	if err != nil {
		return backend.DiskFork{}, err
	}
	// The base keeps the fork's disk as a user where the fork will live
	// (nr.Paths.Dir), not in the staging directory it is made in.
	if err := markUsed(*info, filepath.Join(nr.Paths.Dir, DiskFile)); err != nil {
		os.Remove(overlay)
		return backend.DiskFork{}, err
	}
	if err := atomicfile.Write(filepath.Join(to.Dir, DiskInfoFile), raw, 0o600); err != nil {
		os.Remove(overlay)
		return backend.DiskFork{}, err
	}
	return backend.DiskFork{Bytes: n}, nr.SetSection(s)
}

// adoptKeys keeps in to's AdoptDir the keys the fork's first start logs in
// with: the source's client key and host public key, or, when the source
// is itself a fork that has not started since (s.Adopt set), the keys it
// keeps, whose VM its disk still is. s (r's section) becomes the fork's.
// What it wrote is in to, which the caller removes on a failure.
func adoptKeys(from state.Layout, r *state.Record, s *Settings, to state.Layout) error {
	keys := from
	if s.Adopt != "" {
		keys = state.Layout{Dir: filepath.Join(from.Dir, AdoptDir)}
	} else {
		s.Adopt = seed.InstanceID(r, s.Provision)
	}
	mine := state.Layout{Dir: filepath.Join(to.Dir, AdoptDir)}
	for src, dst := range map[string]string{keys.ClientKey(): mine.ClientKey(), keys.HostPubKey(): mine.HostPubKey()} {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("reading the key the fork logs in with at its first start: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		if err := atomicfile.Write(dst, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// RestoreDisk implements backend.Forker: the checkpoint's overlay is copied
// beside the VM's and renamed over it, then its disk.json; a checkpoint of a
// VM that had never booted removes the VM's disk, which its next start
// makes afresh.
func (b *Backend) RestoreDisk(ctx context.Context, from state.Layout, r *state.Record, to state.Layout) (backend.DiskFork, error) {
	raw, info, err := diskOf(from, "the checkpoint's disk", fmt.Sprintf("so the checkpoint cannot be put back (hint: put it back; VM %q is unchanged)", r.Branch))
	if err != nil {
		return backend.DiskFork{}, err
	}
	if info == nil {
		for _, f := range []string{DiskInfoFile, DiskFile} {
			if err := os.Remove(filepath.Join(to.Dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return backend.DiskFork{}, fmt.Errorf("removing the VM's disk: %w", err)
			}
		}
		return backend.DiskFork{}, nil
	}
	overlay := filepath.Join(to.Dir, DiskFile)
	staged := overlay + ".restore"
	os.Remove(staged) // a rollback interrupted before
	n, err := image.CopyOverlay(ctx, b.Run, filepath.Join(from.Dir, DiskFile), staged, true)
	if err != nil {
		return backend.DiskFork{}, err
	}
	if err := markUsed(*info, overlay); err != nil {
		os.Remove(staged)
		return backend.DiskFork{}, err
	}
	if err := os.Rename(staged, overlay); err != nil {
		os.Remove(staged)
		return backend.DiskFork{}, err
	}
	return backend.DiskFork{Bytes: n}, atomicfile.Write(filepath.Join(to.Dir, DiskInfoFile), raw, 0o600)
}

// diskOf reads the disk.json in l (raw and decoded; nil, nil when there is
// none: no disk made yet) and checks that the disks it is made on are
// there; what names the disk and then says what follows for the error.
func diskOf(l state.Layout, what, then string) ([]byte, *DiskInfo, error) {
	raw, err := os.ReadFile(filepath.Join(l.Dir, DiskInfoFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var info DiskInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", filepath.Join(l.Dir, DiskInfoFile), err)
	}
	for _, f := range []string{info.Base, info.Template} {
		if _, err := os.Stat(f); f != "" && err != nil {
			return nil, nil, fmt.Errorf("the disk %s that %s is made on is gone (was it pruned or moved?), %s", f, what, then)
		}
	}
	return raw, &info, nil
}
