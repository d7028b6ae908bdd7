package driver

import (
	"fmt"
	"io"
	"time"
)

// Machine is what a driver needs to know about one machine.
type Machine struct {
	Name        string // "agent-vm-<slug>"
	UUID        string // unique per machine; "" when its record is lost (see Adopt)
	CPUs        int
	MemoryMiB   int
	RunDir      string       // the driver's run files: pids, markers, sockets
	LogsDir     string       // the console log and the driver's own logs
	Share       Share        // the workspace
	Forwards    []Forward    // host 127.0.0.1 ports to guest ports
	Credentials []Credential // secrets handed to the guest as files
	// Network contains the machine's network (the egress proxy and the exposed
	// ports); nil leaves it unrestricted.
	Network *Network
	// Remote, when set, places the machine on another host, which the
	// driver reaches over agent-vm's link; nil runs it on this machine.
	// Only a driver that can run machines elsewhere accepts it.
	Remote *Remote
	// Adopted is what Adopt learnt from the running machine that the rest
	// does not say (for QEMU: its socket directory). It belongs to the
	// driver; callers pass it back unchanged. nil unless adopted.
	Adopted any
}

// Remote is another host a machine runs on, reached over agent-vm's own
// SSH link to it (internal/hostlink): the pinned host key and agent-vm's
// key pair for that host, never the user's ~/.ssh.
type Remote struct {
	// Host is the registered host's name, for messages.
	Host string
	// Addr is the host's sshd, "host:port"; User logs in there.
	Addr, User string
	// KeyFile is agent-vm's private key for the host (0600); KnownHosts
	// pins the host's key.
	KeyFile, KnownHosts string
	// Dir is agent-vm's directory on the host: its binary, storage pool,
	// and each machine's files there (run files, logs, workspace).
	Dir string
}

// Network is a contained machine network: the guest reaches nothing of
// the host or beyond except the ports at one guest-side address, each of which
// the driver connects to a host-side socket, one relay process per
// connection. The egress proxy serves both kinds: the proxy's port and the
// exposed host ports (internal/egress).
type Network struct {
	// Addr is the guest-side address of the proxy and every exposed port.
	Addr string
	// ProxyPort is the proxy's port (HTTP proxy) at Addr.
	ProxyPort int
	// Exposed are host ports on 127.0.0.1 the guest reaches at Addr, each
	// at the same port number.
	Exposed []int
	// Proxy is the egress proxy's command line; the driver appends
	// "--proxy-socket PATH --exposed-socket PATH --qemu-pidfile PATH" (it
	// exits when the process of that pid file is gone), and "--run-as
	// UID:GID" when the machine runs as another user than agent-vm (the
	// proxy drops to it before serving), runs it for the machine's life
	// (started before, stopped after it) and logs its output.
	Proxy []string
	// ProxyInput, when set, is written to the proxy's standard input as
	// it starts: the VM's secrets (egress.Bundle), which must never be
	// logged, kept in a file or passed as an argument.
	ProxyInput Sealed
	// Dir is the proxy's directory (policy and log), which the driver
	// gives to the user the proxy runs as.
	Dir string
	// ExposedDir, when set, is where the proxy reaches an exposed port: the
	// unix socket ExposedDir/PORT (served from the machine the user exposed
	// the port on, for a machine placed on another host) rather than the
	// host's 127.0.0.1:PORT.
	ExposedDir string
	// Relay is the command line that carries one guest connection (its
	// stdin and stdout) to a socket; the driver appends the socket, and
	// for an exposed port the port. Neither may contain spaces.
	Relay []string
}

// Share is a host directory shared into the guest.
type Share struct {
	Source string // host directory
	Tag    string // mount tag in the guest
	// UID and GID own the workspace on the host (the guest user has the
	// same ids): what the guest creates there must belong to them. 0 when
	// unknown (a machine whose record is lost).
	UID, GID int
	// Cache is how the guest caches the share (ShareCache*); "" is
	// DefaultShareCache. virtiofs only: 9p has its own fixed options.
	Cache string
}

// Share cache modes: virtiofsd's --cache / -o cache=. They trade how soon
// the guest sees the host's changes to the workspace for how often the
// guest asks the host (package qemu's doc has the figures).
const (
	// ShareCacheNone: the guest caches nothing; every stat and read goes
	// to the host, so the host's changes show at once. Slowest for many
	// small files, and files cannot be mmapped shared (FUSE direct I/O).
	ShareCacheNone = "none"
	// ShareCacheAuto: the guest trusts names and attributes for a second
	// and keeps a file's pages while its size and mtime are unchanged when
	// it is opened again: the host's changes show within about a second.
	ShareCacheAuto = "auto"
	// ShareCacheAlways: the guest trusts what it has read for a day: the
	// fastest, but a change made on the host (an edit, a new, deleted or
	// renamed file) may not show until the guest drops its caches.
	ShareCacheAlways = "always"
	// DefaultShareCache is the mode of a VM that does not choose.
	DefaultShareCache = ShareCacheAuto
)

// CheckShareCache refuses a cache mode that is not one of ShareCache*.
func CheckShareCache(mode string) error {
	switch mode {
	case ShareCacheNone, ShareCacheAuto, ShareCacheAlways:
		return nil
	}
	return fmt.Errorf("workspace cache mode %q is not one of none, auto, always (hint: auto, the default, shows host edits within about a second; always is faster and may not show them until the guest drops its caches)", mode)
}

// CacheMode is the share's cache mode, DefaultShareCache when unset.
func (s Share) CacheMode() string {
	if s.Cache == "" {
		return DefaultShareCache
	}
	return s.Cache
}

// Forward forwards 127.0.0.1:Host on the host to Guest in the guest.
type Forward struct {
	Name  string // "ssh", "mcp": for messages
	Host  int
	Guest int
}

// Credential is a file handed to the guest as the systemd credential Name.
// The driver passes the file, never its content on a command line.
type Credential struct {
	Name string
	File string
}

// ShareMode is how the workspace reaches the guest.
type ShareMode string

// Share modes.
const (
	ShareVirtiofs ShareMode = "virtiofs"
	Share9p       ShareMode = "9p"
)

// States a machine can be in, as far as its driver can tell from the host.
const (
	StateStopped = "stopped" // not running, shut down cleanly (or never started)
	StateRunning = "running"
	// StatePaused: the process runs with its CPUs stopped, not by a
	// suspend (a pause by a suspend is StateSuspended).
	StatePaused  = "paused"
	StateCrashed = "crashed" // process gone without a clean shutdown
	// StateSuspended: no guest code runs and the machine's memory is kept,
	// saved in its run directory (QEMU) or in its paused process (QEMU's
	// pause in place, vagrant): Live.Suspend says which. Resume or
	// Continue (or Start, through the caller) brings it back.
	StateSuspended = "suspended"
)

// How a suspended machine keeps its memory (Live.Suspend).
const (
	// SuspendPaused: paused in place. Its process still runs with its CPUs
	// stopped and holds the memory in host RAM, and every device: the
	// workspace stays mounted in the guest. It does not survive the host's
	// reboot.
	SuspendPaused = "paused"
	// SuspendSaved: memory and devices are saved to disk; no process of
	// the machine is left.
	SuspendSaved = "saved"
	// SuspendHibernated: paused in place as SuspendPaused, with the
	// guest's memory moved to a file on disk (Hibernator): its process
	// keeps every device and only its own memory. Continue brings the
	// memory back first.
	SuspendHibernated = "hibernated"
)

// PowerOffMarker is what Linux prints on the serial console as its last
// line when it powers the machine off cleanly.
const PowerOffMarker = "reboot: Power down"

// Live is a machine's live state (see Driver.Inspect).
type Live struct {
	State  string
	Detail string // e.g. "guest powered itself off", "QMP did not answer"
	// Suspend says how a suspended machine keeps its memory
	// (SuspendPaused, SuspendHibernated, SuspendSaved); "" in every other
	// state.
	Suspend string
	Pid     int // the machine's process; also of one paused in place
	// Resident is the host RAM (bytes) the machine's process holds, where
	// the driver reads it: a machine paused in place; 0 when not known.
	Resident int64
	Launch   *Launch // what the last start recorded; nil if never started
	// LaunchErr is why the driver's record of the last start, which
	// exists, could not be read (then Launch is nil).
	LaunchErr error
}

// Alive reports whether the machine runs: its process exists and it is
// not suspended (it may be paused by other means than a suspend).
func (lv Live) Alive() bool { return lv.State == StateRunning || lv.State == StatePaused }

// HasProcess reports whether the machine's process exists: it is Alive,
// or suspended in place (InPlace). What must not happen under a machine's
// process (its disk replaced) asks this, not Alive.
func (lv Live) HasProcess() bool { return lv.Alive() || lv.InPlace() }

// InPlace reports whether the machine is suspended in place: its process
// paused, its memory held (SuspendPaused) or on disk (SuspendHibernated);
// Continue runs it again.
func (lv Live) InPlace() bool {
	return lv.Suspend == SuspendPaused || lv.Suspend == SuspendHibernated
}

// Uptime is how long the machine has been running.
func (lv Live) Uptime(now time.Time) time.Duration {
	if !lv.Alive() || lv.Launch == nil {
		return 0
	}
	return now.Sub(lv.Launch.StartedAt).Truncate(time.Second)
}

// Launch is what a start recorded about a running machine.
type Launch struct {
	Pid         int // the machine's process (QEMU)
	SharePid    int // the process serving the workspace share (virtiofsd); 0 for none
	Accel       string
	AccelReason string
	Share       ShareMode
	StartedAt   time.Time
	// ReadyAt is when the guest first answered after this start (see
	// MarkReady); nil while it boots.
	ReadyAt *time.Time
}

// SSHEndpoint is how a driver says to reach a foreign guest (one made from
// the user's own configuration, state.Guest.Foreign) over SSH: with the
// driver's key and no pinned host key.
type SSHEndpoint struct {
	Host          string
	Port          int
	User          string
	IdentityFiles []string
	// Options are the driver's other ssh_config options (lowercased
	// names), in its order.
	Options [][2]string
}

// Sealed is bytes that hold secrets: every printed form of it (fmt's
// verbs, %+v of a struct that holds it) is "[sealed]", so a log line or
// an error that shows a Network by mistake shows no value.
type Sealed []byte

// Format implements fmt.Formatter.
func (Sealed) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, "[sealed]") }
