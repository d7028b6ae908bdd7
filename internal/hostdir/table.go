package hostdir

import (
	"cmp"
	"os"
	"os/user"
	"path/filepath"
)

// Roots are where agent-vm's well-known host directories go. The zero
// value is the real places; a test sets them under a temporary directory
// to run what a new user runs and then check every directory agent-vm
// made (see Table).
type Roots struct {
	// Lib is root's directory: /var/lib/agent-vm.
	Lib string
	// Egress holds the sockets of egress proxies whose QEMU runs as
	// another user: /run/agent-vm-egress, or agent-vm-egress in the
	// temporary directory on a host without /run.
	Egress string
	// Cache is $XDG_CACHE_HOME/agent-vm (~/.cache/agent-vm).
	Cache string
	// Images, when set, is the image cache instead of Cache/images: a test
	// that runs what a new user runs points it at the base images this
	// machine built already, so that setup finds one rather than building
	// it again (minutes of mmdebstrap that CI's own setup spent).
	Images string
}

func (r Roots) withDefaults(getenv func(string) string) Roots {
	r.Lib = cmp.Or(r.Lib, "/var/lib/agent-vm")
	if r.Egress == "" {
		r.Egress = filepath.Join(os.TempDir(), "agent-vm-egress")
		if fi, err := os.Stat("/run"); err == nil && fi.IsDir() {
			r.Egress = "/run/agent-vm-egress"
		}
	}
	r.Cache = cmp.Or(r.Cache, XDG(getenv, "XDG_CACHE_HOME", ".cache", "agent-vm"))
	return r
}

// Table is the table of agent-vm's well-known host directories, with
// the mode each must have and why: whoever makes one, and whichever of
// them is made first, it comes out the same (Make). Each
// package that makes one is handed its entry; the directories below an
// entry that a package makes per VM are noted where they matter to
// another user.
type Table struct {
	// Lib, /var/lib/agent-vm, root's: 0711. Used as root only. libvirt's
	// QEMU (user libvirt-qemu under qemu:///system) passes through it to
	// Handoff and VagrantHome; nobody needs to list it.
	Lib *Dir
	// Registry, the state directories' registry (state.Registry): 0700,
	// one user's bookkeeping. As root Lib/state-dirs, else
	// $XDG_STATE_HOME/agent-vm/state-dirs, whose agent-vm is 0700 too.
	Registry *Dir
	// VagrantHome, the vagrant driver's VAGRANT_HOME: 0755, as vagrant
	// makes its own directories in it. libvirt's QEMU opens the box's
	// kernel and initrd in it by path (the disk goes to libvirt's pool),
	// which needs search permission only, but nothing in it is secret (the
	// box is the base image, 0755 in Images too), and vagrant's own
	// subdirectories are 0755 whatever VAGRANT_HOME's mode. As root
	// Lib/vagrant, else Cache/vagrant, or $AGENT_VM_VAGRANT_HOME.
	VagrantHome *Dir
	// Handoff, where the vagrant driver puts the files libvirt's QEMU
	// opens (vagrant.Driver.Handoff): 0711, and so are the per-machine
	// directories and their fw_cfg directories the driver makes in it:
	// libvirt's QEMU passes through to the seed and credential copies (each
	// readable by that user alone), and nobody lists the machines. As root
	// Lib/libvirt, or $AGENT_VM_LIBVIRT_DIR; else nil (none: the VM's own
	// directories).
	Handoff *Dir
	// Pool, the directory of agent-vm's libvirt storage pool on this
	// machine (internal/virtpool; the libvirt driver's disks): 0711, which
	// libvirt gives it when it builds the pool; libvirt's QEMU passes
	// through to the volumes, each 0600 and handed to it while its domain
	// runs. As root Lib/pool; else nil (the libvirt driver runs as root).
	Pool *Dir
	// Egress, root's, 0711, as are the per-VM directories the QEMU
	// launcher makes in it: QEMU's guestfwd relays run as the workspace's
	// owner, who must pass through to the VM's sockets and run the relay
	// copy kept here (0755); nobody lists it. Shared: in /tmp, or should
	// /run be another's, a directory someone else made or can write to is
	// refused.
	Egress *Dir
	// Cache, $XDG_CACHE_HOME/agent-vm: 0711, whichever of the image
	// store, the accelerator probe (accel.json, 0600) and the templates
	// made it first. Not 0700: as a user VagrantHome is in it, and
	// libvirt's QEMU must pass through to the box's kernel; not 0755:
	// nobody needs to list it.
	Cache *Dir
	// Templates, Cache/templates, or $AGENT_VM_TEMPLATE_DIR: 0700 (a
	// state directory): templates hold saved VM memory, and their keys
	// and tokens.
	Templates *Dir
	// Images, the image cache: 0755 (the store's own directories too), so
	// that any user's VMs, and libvirt's QEMU through VagrantHome's box,
	// can use the base images. Cache/images; under sudo (not with
	// XDG_CACHE_HOME or Roots.Cache set) the invoking user's
	// ~/.cache/agent-vm/images, so `sudo agent-vm image build` makes the
	// image that user's VMs boot (the store gives what it makes to that
	// user).
	Images *Dir
	// Config, agent-vm's configuration directory, $XDG_CONFIG_HOME/agent-vm
	// (~/.config/agent-vm): 0700, one user's configuration. Secrets and
	// Hosts are in it, and the host's pins file (internal/pins,
	// pins.json, 0600): which names' addresses that are not globally
	// reachable every VM's egress proxy may connect to; nobody else may
	// write it, since it opens a way out of every VM.
	Config *Dir
	// Secrets, the host's store of credentials (internal/secret): 0700,
	// in Config: the values are read by this user's agent-vm alone, and
	// never from a VM's directory, which a guest's helpers reach.
	Secrets *Dir
	// Hosts, the registry of libvirt hosts VMs may be placed on
	// (internal/hosts), $XDG_CONFIG_HOME/agent-vm/hosts
	// (~/.config/agent-vm/hosts): 0700 in the 0700 agent-vm beside
	// Secrets, its files 0600. A host's entry is no credential, but it
	// names the user and machine agent-vm logs in to and the key file it
	// logs in with: one user's configuration, which nobody else needs to
	// read, and which decides where this user's VMs (and their secrets'
	// placeholders) would run, so nobody else may write it.
	Hosts *Dir
	// Browser, $XDG_DATA_HOME/agent-vm/browser
	// (~/.local/share/agent-vm/browser): 0700, as are its parent
	// agent-vm and the profile directory internal/hostbrowser makes in
	// it. It holds the Chromium agent-vm launches for the guests'
	// DevTools relay: its profile (cookies, logged-in sessions: whoever
	// reads them is logged in as the user), its log and its pid file. Data,
	// not cache: the user logs in there once and keeps it.
	Browser *Dir
}

// cacheMode is the cache directory's, wherever it is (see Table.Cache).
const cacheMode = 0o711

// NewTable is the table for roots, with this environment and user.
func NewTable(roots Roots, getenv func(string) string, euid int) Table {
	cacheSet := roots.Cache != "" || getenv("XDG_CACHE_HOME") != ""
	r := roots.withDefaults(getenv)
	h := Table{
		Lib:    Top(r.Lib, 0o711, InSystem),
		Egress: Top(r.Egress, 0o711, InSystem),
		Cache:  Top(r.Cache, cacheMode, InXDG),
	}
	h.Egress.Shared = true
	h.Templates = h.Cache.Sub("templates", 0o700)
	if d := getenv("AGENT_VM_TEMPLATE_DIR"); d != "" {
		h.Templates = Top(d, 0o700, InXDG)
	}
	h.Images = h.Cache.Sub("images", 0o755)
	if roots.Images != "" {
		h.Images = Top(roots.Images, 0o755, InXDG)
	} else if u := getenv("SUDO_USER"); u != "" && euid == 0 && !cacheSet {
		if pw, err := user.Lookup(u); err == nil && pw.HomeDir != "" {
			h.Images = Top(filepath.Join(pw.HomeDir, ".cache", "agent-vm"), cacheMode, InXDG).Sub("images", 0o755)
		}
	}
	home, handoff := getenv("AGENT_VM_VAGRANT_HOME"), getenv("AGENT_VM_LIBVIRT_DIR")
	switch {
	case home != "":
		h.VagrantHome = Top(home, 0o755, InSystem)
	case euid == 0:
		h.VagrantHome = h.Lib.Sub("vagrant", 0o755)
	default:
		h.VagrantHome = h.Cache.Sub("vagrant", 0o755)
	}
	switch {
	case handoff != "":
		h.Handoff = Top(handoff, 0o711, InSystem)
	case euid == 0:
		h.Handoff = h.Lib.Sub("libvirt", 0o711)
	}
	if euid == 0 {
		h.Pool = h.Lib.Sub("pool", 0o711)
	}
	h.Config = Top(XDG(getenv, "XDG_CONFIG_HOME", ".config", "agent-vm"), 0o700, InXDG)
	h.Secrets = h.Config.Sub("secrets", 0o700)
	h.Hosts = h.Config.Sub("hosts", 0o700)
	h.Browser = Top(XDG(getenv, "XDG_DATA_HOME", filepath.Join(".local", "share"), "agent-vm"), 0o700, InXDG).Sub("browser", 0o700)
	if euid == 0 {
		h.Registry = h.Lib.Sub("state-dirs", 0o700)
	} else {
		h.Registry = Top(XDG(getenv, "XDG_STATE_HOME", filepath.Join(".local", "state"), "agent-vm"), 0o700, InXDG).Sub("state-dirs", 0o700)
	}
	return h
}

// StateDir is a state directory (--state-dir; state.Open makes a relative
// path absolute): 0700,
// as are its .locks, .tmp and .trash (state.Open): it holds every VM's
// keys, tokens and disks. The vagrant driver adds search permission for
// others when libvirt's QEMU must reach a VM's files in it (no handoff
// directory), which later opens leave. Its missing ancestors are made
// 0700: it is the user's place.
func StateDir(path string) *Dir {
	return &Dir{Path: path, Mode: 0o700, Allow: 0o001, Place: InXDG}
}

// XDG is $env/name, else ~/fallback/name (an XDG base directory).
func XDG(getenv func(string) string, env, fallback, name string) string {
	if d := getenv(env); d != "" {
		return filepath.Join(d, name)
	}
	home := getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, fallback, name)
}
