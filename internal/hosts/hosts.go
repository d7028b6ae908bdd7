// Package hosts is the registry of libvirt hosts, the machines agent-vm
// may place a branch's VM on (a bigger machine reached with a libvirt
// URI such as qemu+ssh://user@server/system), and their doctor: whether
// agent-vm could use a host, checked with virsh through an execx.Runner.
//
// A host is a short name and a URI (ParseURI says which URIs, and why
// not the others). Each is a file NAME.json, 0600, in a 0700 directory of
// the user's configuration directory (hostdir.Table.Hosts), written
// atomically (internal/atomicfile) under a lock, so two `host add`s of one
// name cannot both win and a failed write leaves the old file or none.
//
// A qemu+ssh host may also have agent-vm's own SSH link (link.go, `host
// link`): its pinned host key and agent-vm's key pair for it, files beside
// the host's. `create --host` places VMs on a host through it: a VM's
// record names its host, and the Manager reads the host's link from here.
package hosts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/flock"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostlink"
)

// Host is one registered host.
type Host struct {
	Name  string    `json:"name"`
	URI   string    `json:"uri"`
	Added time.Time `json:"added"`
	// Dir is agent-vm's directory on a qemu+ssh host, where VMs placed
	// there keep their files ("" for the default, hostlink.DefaultDir).
	Dir string `json:"dir,omitempty"`
	// Link is agent-vm's own SSH link to the host, once `host link` set
	// it up (qemu+ssh hosts only).
	Link *Link `json:"link,omitempty"`
}

// file is a host as its file holds it.
type file struct {
	Version int       `json:"version"`
	Name    string    `json:"name"`
	URI     string    `json:"uri"`
	Added   time.Time `json:"added"`
	Dir     string    `json:"dir,omitempty"`
}

// AgentDir is agent-vm's directory on h.
func (h Host) AgentDir() string {
	if h.Dir == "" {
		return hostlink.DefaultDir
	}
	return h.Dir
}

// AddOptions are what `host add` may set besides the name and URI.
type AddOptions struct {
	// Dir is agent-vm's directory on a qemu+ssh host (absolute, clean);
	// "" for hostlink.DefaultDir.
	Dir string
}

// fileVersion is the version of the host file's format.
const fileVersion = 1

// Local is the name kept for this machine, which needs no entry: a VM
// is placed here unless it names a host.
const Local = "local"

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// CheckName refuses a name that is not a short lower-case name, and
// Local.
func CheckName(name string) error {
	if name == Local {
		return fmt.Errorf("host name %q is kept for this machine, which needs no entry (hint: another name, e.g. big)", name)
	}
	if !nameRE.MatchString(name) {
		return fmt.Errorf("host name %q is not a short name (hint: 1-32 lower-case letters, digits and '-', not starting with '-', e.g. big or gpu-1)", name)
	}
	return nil
}

// ErrNotFound is a name the registry has no host of.
var ErrNotFound = errors.New("no such host")

// ErrExists is a name the registry has a host of already.
var ErrExists = errors.New("a host of that name exists")

// Registry is the hosts in Dir.
type Registry struct {
	Dir *hostdir.Dir
	// Now stamps a new host's Added (nil: time.Now).
	Now func() time.Time
}

func (r *Registry) path(name string) string { return filepath.Join(r.Dir.Path, name+".json") }

// lockFile is the registry's lock, taken by Add.
const lockFile = ".lock"

// Add registers uri under name. Both are checked first (CheckName,
// ParseURI); a name that exists is refused, naming `host rm`.
func (r *Registry) Add(ctx context.Context, name, uri string) (Host, error) {
	return r.AddWith(ctx, name, uri, AddOptions{})
}

// AddWith is Add with o.
func (r *Registry) AddWith(ctx context.Context, name, uri string, o AddOptions) (Host, error) {
	if err := CheckName(name); err != nil {
		return Host{}, err
	}
	u, err := ParseURI(uri)
	if err != nil {
		return Host{}, err
	}
	if o.Dir != "" {
		if !u.Remote() {
			return Host{}, fmt.Errorf("--dir %s is agent-vm's directory on another machine, and %s is this machine's libvirtd, whose VMs keep their files in agent-vm's directories here (hint: drop --dir)", o.Dir, uri)
		}
		if !path.IsAbs(o.Dir) || path.Clean(o.Dir) != o.Dir || o.Dir == "/" {
			return Host{}, fmt.Errorf("--dir %q is not a clean absolute path below / (hint: e.g. %s)", o.Dir, hostlink.DefaultDir)
		}
	}
	if err := r.Dir.Make(); err != nil {
		return Host{}, err
	}
	lock, err := flock.Acquire(ctx, filepath.Join(r.Dir.Path, lockFile), 0o600, nil)
	if err != nil {
		return Host{}, fmt.Errorf("locking the hosts registry: %w", err)
	}
	defer lock.Release()
	if _, err := os.Lstat(r.path(name)); err == nil {
		old := "another URI"
		if h, err := r.Get(name); err == nil {
			old = h.URI
		}
		return Host{}, fmt.Errorf("host %s: %w (%s) (hint: `agent-vm host rm %s` first to replace it)", name, ErrExists, old, name)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Host{}, err
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	h := Host{Name: name, URI: u.Raw, Added: now().UTC().Truncate(time.Second), Dir: o.Dir}
	if err := atomicfile.WriteJSON(r.path(name), file{Version: fileVersion, Name: h.Name, URI: h.URI, Added: h.Added, Dir: h.Dir}, 0o600); err != nil {
		return Host{}, fmt.Errorf("writing host %s: %w", name, err)
	}
	return h, nil
}

// Get reads the host called name. A file that cannot be read as a host
// is an error naming it and the fix.
func (r *Registry) Get(name string) (Host, error) {
	if err := CheckName(name); err != nil {
		return Host{}, err
	}
	b, err := os.ReadFile(r.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return Host{}, r.notFound(name)
	}
	if err != nil {
		return Host{}, err
	}
	var f file
	damaged := func(why string) error {
		return fmt.Errorf("host file %s is damaged: %s (hint: `agent-vm host rm %s`, then `agent-vm host add %s URI` again)", r.path(name), why, name, name)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return Host{}, damaged("not valid JSON")
	}
	switch {
	case f.Version != fileVersion:
		return Host{}, damaged(fmt.Sprintf("version %d, not %d", f.Version, fileVersion))
	case f.Name != name:
		return Host{}, damaged(fmt.Sprintf("it names host %q", f.Name))
	}
	if _, err := ParseURI(f.URI); err != nil {
		return Host{}, damaged(fmt.Sprintf("its URI %q is not one agent-vm accepts", f.URI))
	}
	if f.Dir != "" && (!path.IsAbs(f.Dir) || path.Clean(f.Dir) != f.Dir) {
		return Host{}, damaged(fmt.Sprintf("its directory %q is not a clean absolute path", f.Dir))
	}
	h := Host{Name: f.Name, URI: f.URI, Added: f.Added, Dir: f.Dir}
	if h.Link, err = r.linkOf(h); err != nil {
		return Host{}, err
	}
	return h, nil
}

// notFound is the error for a name the registry lacks: it lists the
// hosts there are, or says how to add one.
func (r *Registry) notFound(name string) error {
	names := r.names()
	if len(names) == 0 {
		return fmt.Errorf("host %s: %w; there are none (hint: `agent-vm host add NAME URI`, e.g. `agent-vm host add big qemu+ssh://you@server/system`)", name, ErrNotFound)
	}
	return fmt.Errorf("host %s: %w; the hosts are %s (hint: `agent-vm host list`)", name, ErrNotFound, strings.Join(names, ", "))
}

// names are the names of the host files, sorted.
func (r *Registry) names() []string {
	ents, err := os.ReadDir(r.Dir.Path)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if ok && !strings.HasPrefix(name, ".") && CheckName(name) == nil {
			out = append(out, name) // not atomicfile's temporary files, the lock, or what is not ours
		}
	}
	sort.Strings(out)
	return out
}

// List reads every host, sorted by name. A damaged file is an error that
// names it; the others are still returned.
func (r *Registry) List() ([]Host, error) {
	if _, err := os.Stat(r.Dir.Path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []Host
	var errs []error
	for _, name := range r.names() {
		h, err := r.Get(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, h)
	}
	return out, errors.Join(errs...)
}

// Remove deletes the host called name, damaged or not. It does not ask
// whether VMs are placed there: the registry knows no VMs, and the
// Manager's RemoveHost refuses a host that still has some first.
func (r *Registry) Remove(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	err := os.Remove(r.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return r.notFound(name)
	}
	if err != nil {
		return err
	}
	if err := r.removeLink(name); err != nil {
		return fmt.Errorf("host %s removed, but not agent-vm's key for it: %w", name, err)
	}
	return atomicfile.SyncDir(r.Dir.Path)
}
