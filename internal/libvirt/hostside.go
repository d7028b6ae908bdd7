package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/libvirtnet"
	"github.com/agent-vm/agent-vm/internal/virtpool"
)

// A machine placed on another host (driver.Machine.Remote) is run there by
// this same driver, inside agent-vm's binary on the host: the driver here
// copies that binary over agent-vm's link (hostlink.Install), uploads the
// base image into the host's pool through libvirt's RPC on the link, and
// runs `agent-vm __libvirt-host` there once per verb, a hostRequest in JSON
// on its standard input and a hostResponse on its standard output. On the
// host everything is local to it: libvirt's socket, the jailed virtiofsd,
// the egress proxy and its fence, the handoff files, the run files and
// pids. What stays here is the machine's record and its forwards, which
// listen on this machine's 127.0.0.1 and reach the guest through the link.
//
// The host's files live under the host's agent-vm directory (Remote.Dir):
//
//	DIR/bin/agent-vm-<sha256>      agent-vm's binary (hostlink.Install)
//	DIR/pool/                      agent-vm's storage pool there
//	DIR/libvirt/DOMAIN/            files handed to libvirt's QEMU
//	DIR/vms/DOMAIN/run|logs|net    a machine's run files, logs, proxy's directory
//	DIR/vms/DOMAIN/workspace       the branch's clone the guest shares

// HostCommand is the hidden verb of agent-vm's binary that serves one
// hostRequest on the host (see ServeHost).
const HostCommand = "__libvirt-host"

// Verbs of a hostRequest.
const (
	verbPrepare = "prepare" // make the machine's directories
	verbStart   = "start"
	verbInspect = "inspect"
	verbStop    = "stop"
	verbDestroy = "destroy" // the domain, its volumes and network; the machine's files stay
	verbRemove  = "remove"  // destroy, then the machine's directory, workspace and all
	verbSuspend = "suspend"
	verbResume  = "resume"
	verbReady   = "ready"
)

// hostRequest is one verb for the host, with the machine as the host sees
// it (hostMachine: its paths there, no forwards, no credentials' files).
type hostRequest struct {
	Verb    string         `json:"verb"`
	Dir     string         `json:"dir"`
	Machine driver.Machine `json:"machine"`
	// Start: the plan (the image staged in the host's pool already: its
	// paths empty), the seed's bytes, the options; the credentials' bytes
	// (written for the start only); the files of the proxy's directory
	// (its policy).
	Boot     *Boot               `json:"boot,omitempty"`
	Seed     []byte              `json:"seed,omitempty"`
	Options  driver.StartOptions `json:"options"`
	Creds    []hostCred          `json:"creds,omitempty"`
	NetFiles map[string][]byte   `json:"net_files,omitempty"`
	Grace    time.Duration       `json:"grace,omitempty"`
	// TestEnv carries the egress proxy's test hooks (proxyTestEnv) from
	// the machine that asks, where a test set them, to the proxy here.
	TestEnv map[string]string `json:"test_env,omitempty"`
	At      time.Time         `json:"at,omitzero"`
}

// proxyTestEnv are the variables of the egress proxy's test hooks (test
// names it resolves, a test CA it trusts): set for agent-vm by a test, they
// reach a proxy on another host only through the request.
var proxyTestEnv = []string{egress.TestHostsEnv, egress.TestRootCAEnv}

// hostCred is a credential's name and content.
type hostCred struct {
	Name string        `json:"name"`
	Data driver.Sealed `json:"data"`
}

// hostResponse is what the host answers.
type hostResponse struct {
	Launch *driver.Launch   `json:"launch,omitempty"`
	Live   *hostLive        `json:"live,omitempty"`
	Net    *libvirtnet.Net  `json:"net,omitempty"`
	Error  string           `json:"error,omitempty"`
	Kind   string           `json:"kind,omitempty"` // which driver error Error is, if one
	Paths  *hostMachineDirs `json:"paths,omitempty"`
}

// hostLive is driver.Live with its error as text.
type hostLive struct {
	driver.Live
	LaunchErr string `json:"launch_err,omitempty"`
}

// hostMachineDirs are a machine's directories on the host.
type hostMachineDirs struct {
	Run, Logs, Net, Workspace string
	// Exposed holds the sockets exposed ports are reached at (see
	// hostlink.ServeSocket).
	Exposed string
}

// Kinds of driver errors a response carries across.
var errKinds = map[string]error{
	"running":     driver.ErrRunning,
	"suspended":   driver.ErrSuspended,
	"not-running": driver.ErrNotRunning,
}

func errKind(err error) string {
	for k, e := range errKinds {
		if errors.Is(err, e) {
			return k
		}
	}
	return ""
}

// hostError is an error the host answered, still matching the driver's
// error it was (errors.Is).
type hostError struct {
	msg  string
	kind error
}

func (e *hostError) Error() string { return e.msg }
func (e *hostError) Unwrap() error { return e.kind }

// hostPoolName is agent-vm's pool's name on a host for the agent-vm
// directory dir there.
func hostPoolName(dir string) string { return virtpool.NameFor(dir, hostlink.DefaultDir) }

// hostDirs are a machine's directories under the host's agent-vm
// directory dir.
func hostDirs(dir string, m driver.Machine) hostMachineDirs {
	base := path.Join(dir, "vms", DomainName(m))
	return hostMachineDirs{Run: path.Join(base, "run"), Logs: path.Join(base, "logs"), Net: path.Join(base, "net"),
		Workspace: path.Join(base, "workspace"), Exposed: path.Join(base, "exposed")}
}

// HostPaths implements driver.Placer: m's workspace and proxy's directory
// on its host.
func (d *Driver) HostPaths(m driver.Machine) driver.HostPaths {
	dirs := hostDirs(m.Remote.Dir, m)
	return driver.HostPaths{Workspace: dirs.Workspace, NetDir: dirs.Net}
}

// ServeHost serves the one hostRequest read from in on this machine (the
// host), with the driver's pieces made from the request's agent-vm
// directory, and writes the hostResponse to out. The error is for a
// request it could not read or an answer it could not write; the verb's
// own failure travels in the response.
func ServeHost(ctx context.Context, in io.Reader, out io.Writer, log hclog.Logger) error {
	var req hostRequest
	if err := json.NewDecoder(io.LimitReader(in, 64<<20)).Decode(&req); err != nil {
		return fmt.Errorf("reading the request on standard input: %w", err)
	}
	res, err := serve(ctx, req, log)
	if err != nil {
		res = hostResponse{Error: err.Error(), Kind: errKind(err)}
	}
	return json.NewEncoder(out).Encode(res)
}

func serve(ctx context.Context, req hostRequest, log hclog.Logger) (hostResponse, error) {
	if !path.IsAbs(req.Dir) || path.Clean(req.Dir) != req.Dir || req.Machine.UUID == "" || req.Machine.Name == "" {
		return hostResponse{}, fmt.Errorf("internal error: a request for the host needs agent-vm's directory there as a clean absolute path (got %q) and the machine's name and uuid", req.Dir)
	}
	top := hostdir.Top(req.Dir, 0o711, hostdir.InSystem)
	d := &Driver{Run: execx.OS{}, Log: log, Handoff: top.Sub("libvirt", 0o711), Pool: path.Join(req.Dir, "pool"), PoolName: hostPoolName(req.Dir)}
	m := req.Machine
	m.Remote = nil
	dirs := hostDirs(req.Dir, m)
	if m.RunDir != dirs.Run || m.LogsDir != dirs.Logs || m.Share.Source != dirs.Workspace || (m.Network != nil && (m.Network.Dir != dirs.Net || m.Network.ExposedDir != dirs.Exposed)) {
		return hostResponse{}, errors.New("internal error: the machine's directories are not the host's for it")
	}
	switch req.Verb {
	case verbPrepare:
		if err := searchableAbove(req.Dir); err != nil {
			return hostResponse{}, err
		}
		vmDir := top.Sub("vms", 0o711).Sub(DomainName(m), 0o711)
		// exposed: 0711, its sockets each given to the proxy's user.
		for _, sub := range []*hostdir.Dir{vmDir.Sub("run", 0o700), vmDir.Sub("logs", 0o700), vmDir.Sub("net", 0o700), vmDir.Sub("exposed", 0o711)} {
			if err := sub.Make(); err != nil {
				return hostResponse{}, err
			}
		}
		return hostResponse{Paths: &dirs}, nil
	case verbStart:
		return serveStart(ctx, d, m, req)
	case verbInspect:
		lv, err := d.Inspect(ctx, m)
		if err != nil {
			return hostResponse{}, err
		}
		res := hostResponse{Live: &hostLive{Live: lv}}
		if lv.LaunchErr != nil {
			res.Live.LaunchErr, res.Live.Live.LaunchErr = lv.LaunchErr.Error(), nil
		}
		if n, err := readNet(m); err == nil {
			res.Net = &n
		}
		return res, nil
	case verbStop:
		return hostResponse{}, d.Stop(ctx, m, req.Grace)
	case verbDestroy:
		return hostResponse{}, d.Destroy(ctx, m)
	case verbRemove:
		err := d.Destroy(ctx, m)
		if err == nil {
			err = os.RemoveAll(filepath.Dir(dirs.Run))
		}
		return hostResponse{}, err
	case verbSuspend:
		return hostResponse{}, d.Suspend(ctx, m, driver.GuestHooks{})
	case verbResume:
		l, err := d.Resume(ctx, m, nil, req.Options)
		return hostResponse{Launch: l}, err
	case verbReady:
		return hostResponse{}, d.MarkReady(m, req.At)
	}
	return hostResponse{}, fmt.Errorf("internal error: no verb %q for the host", req.Verb)
}

// serveStart starts m on the host: the seed and the credentials written
// for the start (the credentials removed after it: the driver hands
// libvirt's QEMU copies of its own), the proxy's directory's files, then
// the driver's Start.
func serveStart(ctx context.Context, d *Driver, m driver.Machine, req hostRequest) (hostResponse, error) {
	if req.Boot == nil {
		return hostResponse{}, errors.New("internal error: a start without a plan")
	}
	boot := *req.Boot
	boot.Seed = filepath.Join(m.RunDir, "seed.iso")
	if err := atomicfile.Write(boot.Seed, req.Seed, 0o600); err != nil {
		return hostResponse{}, err
	}
	creds, err := os.MkdirTemp(m.RunDir, "creds-")
	if err != nil {
		return hostResponse{}, err
	}
	defer os.RemoveAll(creds)
	m.Credentials = nil
	for _, c := range req.Creds {
		if c.Name == "" || filepath.Base(c.Name) != c.Name {
			return hostResponse{}, fmt.Errorf("internal error: credential name %q", c.Name)
		}
		f := filepath.Join(creds, c.Name)
		if err := os.WriteFile(f, c.Data, 0o600); err != nil {
			return hostResponse{}, err
		}
		m.Credentials = append(m.Credentials, driver.Credential{Name: c.Name, File: f})
	}
	for _, k := range proxyTestEnv {
		if v, ok := req.TestEnv[k]; ok {
			os.Setenv(k, v)
		}
	}
	if m.Network != nil {
		for name, b := range req.NetFiles {
			if name == "" || filepath.Base(name) != name {
				return hostResponse{}, fmt.Errorf("internal error: network file name %q", name)
			}
			if err := atomicfile.Write(filepath.Join(m.Network.Dir, name), b, 0o600); err != nil {
				return hostResponse{}, err
			}
		}
	}
	// The accelerator is the host's: KVM only where a test kernel boots
	// under it there (internal/accel, cached per boot of the host), with
	// the base image's kernel in the host's pool.
	qemu, err := execx.OS{}.LookPath(hostpkgs.QEMU().Name)
	if err != nil {
		qemu = hostpkgs.QEMU().Name
	}
	acc := (&accel.Prober{Run: execx.OS{}, QEMU: qemu, CacheDir: d.Handoff.Parent.Sub("cache", 0o700),
		Kernels:  []string{path.Join(d.Pool, boot.Image.Version+"-vmlinuz")},
		Override: os.Getenv("AGENT_VM_ACCEL")}).Probe(ctx)
	req.Options.Accel, req.Options.AccelReason = acc.Accel, acc.Reason
	if fi, err := os.Stat(m.Share.Source); err != nil || !fi.IsDir() {
		return hostResponse{}, fmt.Errorf("the workspace %s is not on the host (hint: `agent-vm destroy` the VM and create it again)", m.Share.Source)
	}
	l, err := d.Start(ctx, m, boot, req.Options)
	if err != nil {
		return hostResponse{}, err
	}
	n, err := readNet(m)
	if err != nil {
		return hostResponse{}, err
	}
	return hostResponse{Launch: l, Net: &n}, nil
}

// readNet is m's network as its start wrote it (NetFile).
func readNet(m driver.Machine) (libvirtnet.Net, error) {
	var n libvirtnet.Net
	b, err := os.ReadFile(runFile(m, NetFile))
	if err != nil {
		return n, err
	}
	if err := json.Unmarshal(b, &n); err != nil || !n.Guest.IsValid() {
		return n, fmt.Errorf("%s does not say the guest's address (%v) (hint: restart the VM)", runFile(m, NetFile), err)
	}
	return n, nil
}

// searchableAbove refuses an agent-vm directory on the host that
// libvirt's QEMU, which runs as a user of its own, could not reach: one
// of the directories above dir that others may not search.
func searchableAbove(dir string) error {
	for p := path.Dir(dir); ; p = path.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("agent-vm's directory %s on the host: %w", dir, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("agent-vm's directory %s on the host lies in %s (mode %04o), which libvirt's QEMU, running as a user of its own, cannot pass through to the VM's disks (hint: `host add` the host again with a --dir whose parent directories others may search, e.g. %s)", dir, p, fi.Mode().Perm(), hostlink.DefaultDir)
		}
		if p == "/" {
			return nil
		}
	}
}
