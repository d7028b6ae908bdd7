package state

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// Registry is one user's list of the state directories agent-vm has
// opened. Host ports are one namespace for the whole machine while VM
// records live in a state directory each, so without it a VM created in
// one state directory (a second --state-dir, a test run, integration-test)
// took the ports a stopped VM of another holds, and whichever started
// second failed. Port allocation reads every registered directory's
// records, under the registry's ports lock.
//
// Each entry is a file named by a hash of the directory's path, holding
// the path. An entry whose directory is gone is dropped when read.
type Registry struct{ Dir *hostdir.Dir }

const registryPortLock = ".ports.lock"

// Add registers root (an absolute path). Registering twice is a no-op.
func (g *Registry) Add(root string) error {
	if err := g.make(); err != nil {
		return err
	}
	p := filepath.Join(g.Dir.Path, registryName(root))
	if b, err := os.ReadFile(p); err == nil && string(b) == root+"\n" {
		return nil
	}
	tmp, err := os.CreateTemp(g.Dir.Path, ".add-*")
	if err != nil {
		return fmt.Errorf("registering state directory %s: %w", root, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(root + "\n"); err != nil {
		tmp.Close()
		return fmt.Errorf("registering state directory %s: %w", root, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("registering state directory %s: %w", root, err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("registering state directory %s: %w", root, err)
	}
	return nil
}

// Roots returns the registered state directories that still exist, and
// removes the entries of those that do not.
func (g *Registry) Roots() ([]string, error) {
	des, err := os.ReadDir(g.Dir.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the state directories' registry %s: %w", g.Dir.Path, err)
	}
	var out []string
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, ".") || !de.Type().IsRegular() {
			continue
		}
		p := filepath.Join(g.Dir.Path, name)
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		root := strings.TrimSuffix(string(b), "\n")
		if !filepath.IsAbs(root) || registryName(root) != name {
			continue // not an entry this code wrote: leave it
		}
		if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
			if errors.Is(err, fs.ErrNotExist) || err == nil {
				os.Remove(p) // the directory is gone (a removed test run): so is its claim
			}
			continue
		}
		out = append(out, root)
	}
	return out, nil
}

// LockPorts serialises port allocation across every registered state
// directory (Root.LockPorts serialises it within one).
func (g *Registry) LockPorts(ctx context.Context) (*Lock, error) {
	if err := g.make(); err != nil {
		return nil, err
	}
	return AcquireLock(ctx, filepath.Join(g.Dir.Path, registryPortLock))
}

func (g *Registry) make() error {
	if err := g.Dir.Make(); err != nil {
		return fmt.Errorf("creating the state directories' registry: %w", err)
	}
	return nil
}

func registryName(root string) string {
	sum := sha256.Sum256([]byte(root))
	return hex.EncodeToString(sum[:12])
}
