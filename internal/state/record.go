package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
)

// RecordVersion is the major version of the VM record this agent-vm writes.
// Adding fields does not bump it (readers ignore unknown fields); changing the
// meaning of a field does, and older agent-vm builds then refuse the record.
//
// Version 2 moved the backends' own fields (image, provision; nixos_config,
// nixpkgs) from the top level into "settings"; version 1 records are
// migrated when read (see migrateV1).
const RecordVersion = 2

// Record is a VM's config.json: everything agent-vm knows about one branch's
// VM that is not live state.
type Record struct {
	Version     int    `json:"version"`
	ID          string `json:"id"`      // random, unique per VM; QEMU's -uuid
	Branch      string `json:"branch"`  // the git branch, as given
	Slug        string `json:"slug"`    // the VM name: Slug(Branch), or RepoSlug(...) (Claim); directory, hostname
	MachineName string `json:"vm_name"` // driver.Machine.Name (QEMU -name, libvirt domain): "agent-vm-<slug>"
	Backend     string `json:"backend"` // "qemu", "nixos", "vagrant", "libvirt"
	// Host is the registered libvirt host (internal/hosts) the VM was
	// placed on with create --host; "" is this machine.
	Host      string    `json:"host,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Ports     Ports     `json:"ports"`
	Resources Resources `json:"resources"`
	Guest     Guest     `json:"guest"`
	Git       Git       `json:"git"`
	// Paths records where this VM's files were when it was created, for
	// people and tools reading config.json. agent-vm itself always derives
	// them from the VM directory (see Layout), so a moved state dir works.
	Paths Paths `json:"paths"`
	// AllowOrigins are the browser origins agent-mcp accepts (--allow-origin).
	AllowOrigins []string `json:"allow_origins,omitempty"`
	// Agent is the agent CLI installed in the guest (create --agent:
	// claude, codex, gemini; see guest.Agents), "" for none.
	Agent string `json:"agent,omitempty"`
	// Agents are a template's agent CLIs (`template build --agents`), each
	// NAME@VERSION, installed at its first boot; a VM's own is Agent.
	Agents []string `json:"agents,omitempty"`
	// Forwards are the user's own forwards of guest ports to 127.0.0.1 on
	// the host (`agent-vm port add`), applied at every start and, while
	// the VM runs, at once.
	Forwards []Forward `json:"forwards,omitempty"`
	// Packages are the packages create --packages asked for, installed in
	// the guest at the first boot of its root disk (Debian package names
	// for qemu, nixpkgs attribute names for nixos).
	Packages []string `json:"packages,omitempty"`
	// RepoPackages are the packages the repository's .agent-vm/config.toml
	// listed when the VM was created or last reset, installed likewise.
	RepoPackages []string `json:"repo_packages,omitempty"`
	// IdleSuspend is the repository's idle_suspend when the VM was created
	// (its .agent-vm/config.toml): idle that long, the VM hibernates.
	IdleSuspend string `json:"idle_suspend,omitempty"`
	// AutoCheckpoint takes checkpoints of the VM while its agent works
	// (run --checkpoint-every, checkpoint --every); nil: none.
	AutoCheckpoint *AutoCheckpoint `json:"auto_checkpoint,omitempty"`
	// NoHostCA: the guest does not trust the CA certificates the host added
	// (create --no-host-ca); by default it does (see internal/hostca).
	NoHostCA bool `json:"no_host_ca,omitempty"`
	// Exposed are the host ports the guest may reach (at guest.HostAddr):
	// its only ways to the host's services.
	Exposed []Exposed `json:"exposed,omitempty"`
	// Net is the VM's egress policy (create --net, `agent-vm net`); nil is
	// the default: mode allow with the default allow-list.
	Net *Net `json:"net,omitempty"`
	// MCPSynced are the MCP servers `mcp sync` last wrote into the guest's
	// Claude Code configuration (so the next sync removes the ones the host
	// no longer has, and no server the guest added itself).
	MCPSynced []string `json:"mcp_synced,omitempty"`
	// WorkspaceCache is how the guest caches the workspace share
	// (create/start --workspace-cache: none, auto, always; see
	// driver.ShareCache*); "" is the default, driver.DefaultShareCache.
	WorkspaceCache string `json:"workspace_cache,omitempty"`
	// Placeholders are what the guest holds in place of each secret in
	// the VM's scope, by the secret's name (internal/secret): random, not
	// derived from the value, kept so that they stay the same from start
	// to start. Never a value.
	Placeholders map[string]string `json:"placeholders,omitempty"`
	// SecretHosts are the hosts those secrets are bound to (from the last
	// start), which the VM's egress policy allows: binding a credential to
	// a host says the VM is to reach it.
	SecretHosts []string `json:"secret_hosts,omitempty"`
	// Settings is the backend's own section, which only that backend reads
	// and writes (see Section and SetSection): what the user chose at create
	// for that backend, and its own counters.
	Settings json.RawMessage `json:"settings,omitempty"`
}

// MachineName is the driver's name of the machine of the VM named slug
// (Record.MachineName).
func MachineName(slug string) string { return "agent-vm-" + slug }

// ForkAs is the record of a fork of r's VM (agent-vm fork) on branch,
// named slug: what r's guest and network were given (size, agent,
// packages, network policy, the secrets' placeholders and hosts, exposed
// host ports, browser origins, the MCP servers synced in, the source
// repository) under an identity of its own: a new id, branch, name and
// time, and no ports, forwards or paths yet (host ports are each VM's own;
// the caller assigns them). The backend's section is left for the
// backend to set.
func (r *Record) ForkAs(branch, slug string, now time.Time) (*Record, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	f := &Record{}
	if err := json.Unmarshal(b, f); err != nil { // a deep copy
		return nil, err
	}
	f.ID, f.Branch, f.Slug, f.MachineName = NewID(), branch, slug, MachineName(slug)
	f.CreatedAt = now.UTC().Truncate(time.Second)
	f.Ports, f.Forwards, f.Paths, f.Settings = Ports{}, nil, Paths{}, nil
	return f, nil
}

// ForwardList is the record's forwards (the user's own, `agent-vm
// port`), never nil: JSON prints [].
func (r *Record) ForwardList() []Forward {
	if r.Forwards == nil {
		return []Forward{}
	}
	return r.Forwards
}

// AllPackages are Packages then RepoPackages, each name once.
func (r *Record) AllPackages() []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range append(append([]string{}, r.Packages...), r.RepoPackages...) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// Section decodes the backend's section into v (left as it is when the
// record has none).
func (r *Record) Section(v any) error {
	if len(r.Settings) == 0 {
		return nil
	}
	if err := json.Unmarshal(r.Settings, v); err != nil {
		return fmt.Errorf("the %s backend's settings in the record of %q: %w", r.Backend, r.Branch, err)
	}
	return nil
}

// SectionOf decodes r's backend section as a T (T's zero value when the
// record has none).
func SectionOf[T any](r *Record) (T, error) {
	var v T
	return v, r.Section(&v)
}

// SetSection stores v as the backend's section.
func (r *Record) SetSection(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding the %s backend's settings: %w", r.Backend, err)
	}
	r.Settings = b
	return nil
}

// Ports are the host ports forwarded to the guest, bound to 127.0.0.1.
type Ports struct {
	SSH int `json:"ssh"`
	MCP int `json:"mcp"`
	// SSHChosen and MCPChosen: the user gave the port (--ssh-port,
	// --port). agent-vm picked the others and picks them again at a
	// start that finds another program on them (portbook.Book.Rebind); a
	// chosen port is the user's to free.
	SSHChosen bool `json:"ssh_chosen"`
	MCPChosen bool `json:"mcp_chosen"`
}

// Forward forwards 127.0.0.1:Host on the host to Guest in the guest.
type Forward struct {
	Guest int `json:"guest"`
	Host  int `json:"host"`
	// Chosen: the user gave Host (`port add GUEST HOST`); else agent-vm
	// picked it, as Ports' own.
	Chosen bool `json:"chosen"`
}

// Exposed is a host port the guest may reach, why, and who asked for it.
type Exposed struct {
	Port int    `json:"port"`
	Why  string `json:"why"`
	By   string `json:"by"` // ExposedByMCPSync, or the command that added it
}

// Net is a VM's egress policy as the user set it; the proxy's policy adds
// the defaults (internal/egress, netpolicy.Policy).
type Net struct {
	Mode  string   `json:"mode"`            // open, allow, ask, offline
	Allow []string `json:"allow,omitempty"` // added with `net allow`
	Deny  []string `json:"deny,omitempty"`  // added with `net deny`
	// Requests are the request rules added with `net allow|deny BRANCH
	// 'METHOD host/path'`, newest first, each "allow ..." or "deny ..."
	// (internal/egress's request rules).
	Requests []string `json:"requests,omitempty"`
	// Repo is the repository's own policy (its .agent-vm/policy.toml) as
	// it was read when the VM was made, from the commit the VM started at;
	// nil when it had none. The workspace's copy is never read again: the
	// agent can write it.
	Repo *RepoNet `json:"repo,omitempty"`
	// AskWait is how long, in seconds, mode ask holds a connection for the
	// user's answer (`net mode ask --wait`); 0 is the proxy's default.
	AskWait int `json:"ask_wait_s,omitempty"`
}

// RepoNet is a repository's network policy kept in a VM's record, each
// entry as `net allow|deny` would keep it.
type RepoNet struct {
	File     string   `json:"file"`   // as read: BRANCH:.agent-vm/policy.toml
	Sum      string   `json:"sha256"` // of the file's content
	Allow    []string `json:"allow,omitempty"`
	Deny     []string `json:"deny,omitempty"`
	Requests []string `json:"requests,omitempty"`
	// Secrets narrows the hosts of the user's secrets it names (only those
	// of the user's hosts it lists); MCP, when the file has it, names the
	// host MCP servers mcp sync brings in.
	Secrets map[string][]string `json:"secrets,omitempty"`
	MCP     *[]string           `json:"mcp,omitempty"`
}

// ExposedByMCPSync marks the ports `mcp sync` exposes: each sync replaces
// its own and leaves the others.
const ExposedByMCPSync = "mcp sync"

// Resources are the VM's size.
type Resources struct {
	CPUs      int `json:"cpus"`
	MemoryMiB int `json:"memory_mib"`
	DiskGiB   int `json:"disk_gib"`
}

// Guest describes the login user inside the VM.
type Guest struct {
	User string `json:"user"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	// Proxy: the guest was set up (at create or reset) to reach the
	// network through the VM's egress proxy. Guests set up by an agent-vm
	// from before network containment reach no network until a reset.
	Proxy bool `json:"proxy,omitempty"`
	// Foreign is the user's own configuration the guest is made from, run
	// as is (the repository's Vagrantfile), "" for a guest agent-vm set
	// up. A foreign guest has no agent-mcp, no pinned host key and none of
	// agent-vm's setup; it is reached over SSH as its driver says.
	Foreign string `json:"foreign,omitempty"`
}

// Git records where the workspace came from.
type Git struct {
	Source string `json:"source"` // the checkout create ran in (its top level)
	// Repo identifies the repository the VM belongs to (see gitws.RepoID):
	// a VM is one repository's and one branch's. Records from before it
	// existed get it from Source when first read (vm.Manager.List).
	Repo        string `json:"repo"`
	OriginURL   string `json:"origin_url"`   // the workspace's origin
	UpstreamURL string `json:"upstream_url"` // the source's own origin ("" when it has none)
}

// Paths are informational absolute paths (see Record.Paths).
type Paths struct {
	Dir        string `json:"dir"`
	Workspace  string `json:"workspace"`
	SSHKey     string `json:"ssh_key"`
	KnownHosts string `json:"known_hosts"`
}

// ErrNotFound is returned when a VM directory or record does not exist.
var ErrNotFound = errors.New("not found")

// NotFound is an error for the user (msg) that matches ErrNotFound.
func NotFound(msg string) error { return notFoundError(msg) }

type notFoundError string

func (e notFoundError) Error() string        { return string(e) }
func (e notFoundError) Is(target error) bool { return target == ErrNotFound }

// Follow returns the record of the VM of l as it is now: read again when
// its file changed (commands write it while the VM runs: port add, net,
// checkpoint --every), else as last read; r, the record as the caller read
// it, while none can be read. For long-lived watchers of a running VM
// (its holder).
func Follow(l Layout, r *Record) func() *Record {
	last := [3]int64{-1} // read at the first call
	return func() *Record {
		if st := fileStamp(l.Record()); st != last {
			if nr, err := ReadRecord(l.Record()); err == nil {
				r, last = nr, st
			}
		}
		return r
	}
}

// fileStamp is what tells a file's change: its modification time, size
// and inode. Records are written by a rename (WriteRecord), so a new one
// is a new inode even when it has the size and, within the kernel's
// timestamp tick, the modification time of the one before.
func fileStamp(path string) [3]int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return [3]int64{}
	}
	var ino int64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = int64(st.Ino)
	}
	return [3]int64{fi.ModTime().UnixNano(), fi.Size(), ino}
}

// ReadRecord reads and checks a config.json.
func ReadRecord(path string) (*Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("reading %s: %w", path, ErrNotFound)
		}
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return ParseRecord(path, b)
}

// ParseRecord decodes a record, tolerating unknown fields and refusing a
// newer major version. path is only used in messages.
func ParseRecord(path string, b []byte) (*Record, error) {
	var probe struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("%s is not valid JSON: %v (hint: fix or remove the file; `agent-vm destroy --force` removes the VM)", path, err)
	}
	if probe.Version == nil || *probe.Version < 1 {
		return nil, fmt.Errorf("%s has no record version; it was not written by agent-vm (hint: remove the directory if it is not yours)", path)
	}
	if *probe.Version > RecordVersion {
		return nil, fmt.Errorf("%s was written by a newer agent-vm (record version %d; this agent-vm reads version %d) (hint: upgrade agent-vm)", path, *probe.Version, RecordVersion)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %v (hint: fix or remove the file)", path, err)
	}
	if *probe.Version == 1 {
		if err := migrateV1(&r, b); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if len(r.Settings) > 0 {
		// Compact, as SetSection writes it, so comparing sections compares
		// their content, not how the file was indented.
		var buf bytes.Buffer
		if err := json.Compact(&buf, r.Settings); err != nil {
			return nil, fmt.Errorf("%s: settings: %w", path, err)
		}
		r.Settings = buf.Bytes()
	}
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// migrateV1 moves a version 1 record's backend fields into its section, in
// the shape each backend's section has (debian.Settings, nixos.Settings).
// The file itself is rewritten only when agent-vm next writes the record.
func migrateV1(r *Record, b []byte) error {
	var v1 struct {
		Image       string `json:"image"`
		NixOSConfig string `json:"nixos_config"`
		Nixpkgs     string `json:"nixpkgs"`
		Provision   int    `json:"provision"`
	}
	if err := json.Unmarshal(b, &v1); err != nil {
		return err
	}
	r.Version = RecordVersion
	switch r.Backend {
	case "qemu":
		return r.SetSection(map[string]any{"image": v1.Image, "provision": v1.Provision})
	case "nixos":
		return r.SetSection(map[string]any{"config": v1.NixOSConfig, "nixpkgs": v1.Nixpkgs})
	}
	return nil
}

func (r *Record) check() error {
	switch {
	case r.Branch == "":
		return errors.New("record has no branch")
	case !ValidSlug(r.Slug):
		return fmt.Errorf("record has an invalid slug %q", r.Slug)
	case r.Ports.SSH <= 0 || r.Ports.SSH > 65535 || r.Ports.MCP <= 0 || r.Ports.MCP > 65535:
		return fmt.Errorf("record has invalid ports ssh=%d mcp=%d", r.Ports.SSH, r.Ports.MCP)
	}
	guests, hosts := map[int]bool{}, map[int]bool{r.Ports.SSH: true, r.Ports.MCP: true}
	for _, f := range r.Forwards {
		switch {
		case f.Guest <= 0 || f.Guest > 65535 || f.Host <= 0 || f.Host > 65535:
			return fmt.Errorf("record has an invalid forward of guest port %d to host port %d", f.Guest, f.Host)
		case guests[f.Guest]:
			return fmt.Errorf("record forwards guest port %d twice", f.Guest)
		case hosts[f.Host]:
			return fmt.Errorf("record uses host port %d twice", f.Host)
		}
		guests[f.Guest], hosts[f.Host] = true, true
	}
	return nil
}

// Marshal renders the record as it is stored: indented JSON with a newline.
func (r *Record) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteRecord stores the record atomically with mode 0600.
func WriteRecord(path string, r *Record) error {
	b, err := r.Marshal()
	if err != nil {
		return fmt.Errorf("encoding record: %w", err)
	}
	return atomicfile.Write(path, b, 0o600)
}

// AutoCheckpoint is how the VM's holder takes checkpoints as its agent
// works: one Every (a Go duration) while an agent session worked since the
// last, the newest Keep of them kept.
type AutoCheckpoint struct {
	Every string `json:"every"`
	Keep  int    `json:"keep"`
}
