// Package virtpool is agent-vm's storage pool on a libvirt host: where the
// disks of the VMs placed on that host live, through libvirt's storage API
// (github.com/digitalocean/go-libvirt), so the same calls serve this
// machine's libvirtd and another machine's reached over agent-vm's link
// (internal/hostlink).
//
// The pool is a directory pool of agent-vm's own ("agent-vm", in a
// directory agent-vm chooses on the host), never the host's "default"
// pool, so nothing agent-vm deletes is another program's. In it:
//
//   - base volumes, uploaded once per host and content (the base image's
//     disk, kernel and initrd), named by the caller from the image's
//     version. An upload is complete only once its marker volume
//     (<name>.done, empty) exists: a base without one (an upload cut off) is
//     deleted and sent again, since libvirt can rename no volume.
//   - per VM, a qcow2 overlay backed by a base (its root disk) and small
//     files written whole (the cloud-init seed), each 0600.
//
// Prune deletes the base volumes no overlay is backed by, except those the
// caller keeps (the current image's).
package virtpool

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/digitalocean/go-libvirt"
)

// DefaultName is agent-vm's pool's name on every host.
const DefaultName = "agent-vm"

// NameFor is the name of the pool in agent-vm's directory dir on a host
// (the pool's directory is dir/pool): DefaultName for the host's default
// directory def, else a name of dir's own, so that two agent-vm
// directories on one host (a test's, CI's, the host's own) never claim
// one pool.
func NameFor(dir, def string) string {
	if dir == def {
		return DefaultName
	}
	sum := sha256.Sum256([]byte(dir))
	return DefaultName + "-" + hex.EncodeToString(sum[:4])
}

// doneSuffix names a base volume's completion marker.
const doneSuffix = ".done"

// Pool is agent-vm's storage pool on one libvirt host.
type Pool struct {
	L *libvirt.Libvirt
	// Name is the pool's name ("": DefaultName; tests: one of their own).
	Name string
	// Dir is the pool's directory on the host, absolute.
	Dir string
}

func (p Pool) name() string {
	if p.Name == "" {
		return DefaultName
	}
	return p.Name
}

var volNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}$`)

func checkName(name string) error {
	if !volNameRE.MatchString(name) || strings.HasSuffix(name, doneSuffix) {
		return fmt.Errorf("internal error: volume name %q", name)
	}
	return nil
}

type poolXML struct {
	XMLName xml.Name `xml:"pool"`
	Type    string   `xml:"type,attr"`
	Name    string   `xml:"name"`
	Target  struct {
		Path        string `xml:"path"`
		Permissions *perms `xml:"permissions,omitempty"`
	} `xml:"target"`
}

// Foreign reads a pool's XML (desc, as libvirt describes it) and says
// whether that pool is not agent-vm's pool in dir (a directory pool
// there): its type and directory, for the error that names them.
func Foreign(desc, dir string) (typ, target string, foreign bool, err error) {
	var x poolXML
	if err := xml.Unmarshal([]byte(desc), &x); err != nil {
		return "", "", false, err
	}
	return x.Type, x.Target.Path, x.Type != "dir" || path.Clean(x.Target.Path) != dir, nil
}

type perms struct {
	Mode string `xml:"mode"`
}

// Ensure makes the pool if the host has none of that name (its directory
// too, 0711: libvirt's QEMU passes through it to the volumes libvirt hands
// it), starts it if it is not running, and marks it to start with libvirtd.
// A pool of that name with another directory is an error naming both.
func (p Pool) Ensure() (libvirt.StoragePool, error) {
	if !path.IsAbs(p.Dir) || path.Clean(p.Dir) != p.Dir {
		return libvirt.StoragePool{}, fmt.Errorf("internal error: pool directory %q is not a clean absolute path", p.Dir)
	}
	sp, err := p.L.StoragePoolLookupByName(p.name())
	if err != nil && !isErr(err, libvirt.ErrNoStoragePool) {
		return libvirt.StoragePool{}, fmt.Errorf("looking up storage pool %s: %w", p.name(), err)
	}
	if err != nil {
		var x poolXML
		x.Type, x.Name, x.Target.Path, x.Target.Permissions = "dir", p.name(), p.Dir, &perms{Mode: "0711"}
		b, err := xml.Marshal(x)
		if err != nil {
			return libvirt.StoragePool{}, err
		}
		if sp, err = p.L.StoragePoolDefineXML(string(b), 0); err != nil {
			return libvirt.StoragePool{}, fmt.Errorf("defining storage pool %s at %s: %w", p.name(), p.Dir, err)
		}
		if err := p.L.StoragePoolBuild(sp, 0); err != nil {
			_ = p.L.StoragePoolUndefine(sp)
			return libvirt.StoragePool{}, fmt.Errorf("making storage pool %s's directory %s: %w", p.name(), p.Dir, err)
		}
	} else {
		desc, err := p.L.StoragePoolGetXMLDesc(sp, 0)
		if err != nil {
			return libvirt.StoragePool{}, err
		}
		typ, target, foreign, err := Foreign(desc, p.Dir)
		if err != nil {
			return libvirt.StoragePool{}, fmt.Errorf("reading storage pool %s: %w", p.name(), err)
		}
		if foreign {
			return libvirt.StoragePool{}, fmt.Errorf("the host has a storage pool %s of type %s at %s, not agent-vm's at %s (hint: if it is an older one of agent-vm's, `virsh pool-destroy %s; virsh pool-undefine %s` on the host; its volumes stay in the directory)", p.name(), typ, target, p.Dir, p.name(), p.name())
		}
	}
	state, _, _, _, err := p.L.StoragePoolGetInfo(sp)
	if err != nil {
		return libvirt.StoragePool{}, err
	}
	running := libvirt.StoragePoolState(state) == libvirt.StoragePoolRunning
	if running && p.L.StoragePoolRefresh(sp, 0) != nil {
		// Its directory went (removed by hand, or moved aside) while
		// libvirtd kept the pool active. A failed refresh stops the pool
		// (libvirt 9.0); one still active is stopped here, to make the
		// directory again and start the pool on it.
		if state, _, _, _, err := p.L.StoragePoolGetInfo(sp); err == nil && libvirt.StoragePoolState(state) == libvirt.StoragePoolRunning {
			if err := p.L.StoragePoolDestroy(sp); err != nil {
				return libvirt.StoragePool{}, fmt.Errorf("stopping storage pool %s, whose directory %s cannot be read: %w", p.name(), p.Dir, err)
			}
		}
		running = false
	}
	if !running {
		// Build makes the directory when it is not there (a pool defined
		// earlier, its directory removed since) and does nothing else.
		if err := p.L.StoragePoolBuild(sp, 0); err != nil {
			return libvirt.StoragePool{}, fmt.Errorf("making storage pool %s's directory %s: %w", p.name(), p.Dir, err)
		}
		if err := p.L.StoragePoolCreate(sp, 0); err != nil {
			return libvirt.StoragePool{}, fmt.Errorf("starting storage pool %s: %w", p.name(), err)
		}
	}
	if err := p.L.StoragePoolSetAutostart(sp, 1); err != nil {
		return libvirt.StoragePool{}, fmt.Errorf("marking storage pool %s to start with libvirtd: %w", p.name(), err)
	}
	return sp, nil
}

func isErr(err error, code libvirt.ErrorNumber) bool {
	var e libvirt.Error
	return errors.As(err, &e) && e.Code == uint32(code)
}

// Vol is a volume of the pool.
type Vol struct {
	Name string
	// Path is the volume's file on the host (what a domain's XML names).
	Path string
}

type volXML struct {
	XMLName  xml.Name `xml:"volume"`
	Name     string   `xml:"name"`
	Capacity struct {
		Unit  string `xml:"unit,attr"`
		Value uint64 `xml:",chardata"`
	} `xml:"capacity"`
	Target struct {
		Path   string `xml:"path,omitempty"`
		Format struct {
			Type string `xml:"type,attr"`
		} `xml:"format"`
		Permissions *perms `xml:"permissions,omitempty"`
	} `xml:"target"`
	Backing *struct {
		Path   string `xml:"path"`
		Format struct {
			Type string `xml:"type,attr"`
		} `xml:"format"`
	} `xml:"backingStore,omitempty"`
}

func (p Pool) pool() (libvirt.StoragePool, error) {
	sp, err := p.L.StoragePoolLookupByName(p.name())
	if err != nil {
		return sp, fmt.Errorf("storage pool %s: %w (hint: it is made at a VM's first start on the host)", p.name(), err)
	}
	return sp, nil
}

func (p Pool) create(sp libvirt.StoragePool, name, format string, capacity uint64, backing *Vol) (libvirt.StorageVol, error) {
	var x volXML
	x.Name = name
	x.Capacity.Unit, x.Capacity.Value = "bytes", capacity
	x.Target.Format.Type = format
	x.Target.Permissions = &perms{Mode: "0600"}
	if backing != nil {
		x.Backing = &struct {
			Path   string `xml:"path"`
			Format struct {
				Type string `xml:"type,attr"`
			} `xml:"format"`
		}{Path: backing.Path}
		x.Backing.Format.Type = "qcow2"
	}
	b, err := xml.Marshal(x)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	v, err := p.L.StorageVolCreateXML(sp, string(b), 0)
	if err != nil {
		return libvirt.StorageVol{}, fmt.Errorf("making volume %s in storage pool %s: %w", name, p.name(), err)
	}
	return v, nil
}

func (p Pool) vol(v libvirt.StorageVol) (Vol, error) {
	pth, err := p.L.StorageVolGetPath(v)
	if err != nil {
		return Vol{}, err
	}
	return Vol{Name: v.Name, Path: pth}, nil
}

// lookup finds the volume name; ok false when there is none.
func (p Pool) lookup(sp libvirt.StoragePool, name string) (libvirt.StorageVol, bool, error) {
	v, err := p.L.StorageVolLookupByName(sp, name)
	if isErr(err, libvirt.ErrNoStorageVol) {
		return libvirt.StorageVol{}, false, nil
	}
	if err != nil {
		return libvirt.StorageVol{}, false, fmt.Errorf("looking up volume %s: %w", name, err)
	}
	return v, true, nil
}

// Base uploads a base volume once: name (the caller's, from the content's
// version) in format ("qcow2" or "raw"), size bytes read from open's
// reader, unless the pool has it complete already (then uploaded is false
// and open is not called). A base left incomplete by an earlier upload is
// deleted and sent again.
func (p Pool) Base(name, format string, size int64, open func() (io.ReadCloser, error)) (v Vol, uploaded bool, err error) {
	if err := checkName(name); err != nil {
		return Vol{}, false, err
	}
	sp, err := p.pool()
	if err != nil {
		return Vol{}, false, err
	}
	existing, ok, err := p.lookup(sp, name)
	if err != nil {
		return Vol{}, false, err
	}
	if ok {
		if _, done, err := p.lookup(sp, name+doneSuffix); err != nil {
			return Vol{}, false, err
		} else if done {
			v, err := p.vol(existing)
			return v, false, err
		}
		if err := p.L.StorageVolDelete(existing, 0); err != nil {
			return Vol{}, false, fmt.Errorf("deleting the incomplete upload %s: %w", name, err)
		}
	}
	r, err := open()
	if err != nil {
		return Vol{}, false, err
	}
	defer r.Close()
	sv, err := p.create(sp, name, format, uint64(size), nil)
	if err != nil {
		return Vol{}, false, err
	}
	if err := p.L.StorageVolUpload(sv, io.LimitReader(r, size), 0, uint64(size), 0); err != nil {
		_ = p.L.StorageVolDelete(sv, 0)
		return Vol{}, false, fmt.Errorf("uploading %s to the host: %w", name, err)
	}
	if _, err := p.create(sp, name+doneSuffix, "raw", 0, nil); err != nil {
		return Vol{}, false, err
	}
	v, err = p.vol(sv)
	return v, true, err
}

// Overlay makes name, a qcow2 volume of capacity bytes backed by base (a
// VM's root disk), replacing none: a volume of that name is an error.
func (p Pool) Overlay(name string, base Vol, capacity uint64) (Vol, error) {
	if err := checkName(name); err != nil {
		return Vol{}, err
	}
	sp, err := p.pool()
	if err != nil {
		return Vol{}, err
	}
	sv, err := p.create(sp, name, "qcow2", capacity, &base)
	if err != nil {
		return Vol{}, err
	}
	return p.vol(sv)
}

// Put writes data as the raw volume name, replacing one there (a VM's
// seed, written at every start).
func (p Pool) Put(name string, data []byte) (Vol, error) {
	if err := checkName(name); err != nil {
		return Vol{}, err
	}
	sp, err := p.pool()
	if err != nil {
		return Vol{}, err
	}
	if old, ok, err := p.lookup(sp, name); err != nil {
		return Vol{}, err
	} else if ok {
		if err := p.L.StorageVolDelete(old, 0); err != nil {
			return Vol{}, fmt.Errorf("replacing volume %s: %w", name, err)
		}
	}
	sv, err := p.create(sp, name, "raw", uint64(len(data)), nil)
	if err != nil {
		return Vol{}, err
	}
	if err := p.L.StorageVolUpload(sv, bytes.NewReader(data), 0, uint64(len(data)), 0); err != nil {
		_ = p.L.StorageVolDelete(sv, 0)
		return Vol{}, fmt.Errorf("uploading %s to the host: %w", name, err)
	}
	return p.vol(sv)
}

// Delete removes the volumes named (and a base's marker); those the pool
// has not, or a pool that is not there, are nothing to do.
func (p Pool) Delete(names ...string) error {
	sp, err := p.L.StoragePoolLookupByName(p.name())
	if isErr(err, libvirt.ErrNoStoragePool) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage pool %s: %w", p.name(), err)
	}
	var errs []error
	for _, n := range names {
		for _, name := range []string{n, n + doneSuffix} {
			v, ok, err := p.lookup(sp, name)
			if err == nil && ok {
				err = p.L.StorageVolDelete(v, 0)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("deleting volume %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Prune deletes every base volume (one with a completion marker) that no
// volume of the pool is backed by and keep does not name, and returns
// their names.
func (p Pool) Prune(keep ...string) ([]string, error) {
	sp, err := p.pool()
	if err != nil {
		return nil, err
	}
	if err := p.L.StoragePoolRefresh(sp, 0); err != nil {
		return nil, err
	}
	vols, _, err := p.L.StoragePoolListAllVolumes(sp, 1, 0)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	used := map[string]bool{}
	for _, v := range vols {
		names[v.Name] = true
		desc, err := p.L.StorageVolGetXMLDesc(v, 0)
		if err != nil {
			return nil, err
		}
		var x volXML
		if err := xml.Unmarshal([]byte(desc), &x); err != nil {
			return nil, fmt.Errorf("reading volume %s: %w", v.Name, err)
		}
		if x.Backing != nil && x.Backing.Path != "" {
			used[path.Base(x.Backing.Path)] = true
		}
	}
	var pruned []string
	for n := range names {
		base, isMarker := strings.CutSuffix(n, doneSuffix)
		if !isMarker || used[base] || slices.Contains(keep, base) {
			continue
		}
		if err := p.Delete(base); err != nil {
			return pruned, err
		}
		pruned = append(pruned, base)
	}
	return pruned, nil
}

// Find is the volume name, or nil when the pool has none.
func (p Pool) Find(name string) (*Vol, error) {
	sp, err := p.pool()
	if err != nil {
		return nil, err
	}
	v, ok, err := p.lookup(sp, name)
	if err != nil || !ok {
		return nil, err
	}
	vol, err := p.vol(v)
	return &vol, err
}
