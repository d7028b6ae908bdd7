package libvirt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/virtpool"
)

// The driver's side of a machine placed on another host (see hostside.go):
// each verb opens agent-vm's link to the host, makes sure agent-vm's
// binary is there, and has it run the verb.

// hostLink is an open link to m's host, with agent-vm's binary there.
type hostLink struct {
	c     *ssh.Client
	agent string
	r     *driver.Remote
}

func (l *hostLink) Close() { l.c.Close() }

// linkTo opens the link to m's host and installs agent-vm's binary there
// (once per content: hostlink.Install finds it in place after).
func (d *Driver) linkTo(ctx context.Context, m driver.Machine) (*hostLink, error) {
	r := m.Remote
	if r.Addr == "" {
		return nil, fmt.Errorf("host %s, which %s is placed on, is not registered with agent-vm's link here (hint: `agent-vm host list`; `agent-vm host link %s` sets the link up)", r.Host, m.Name, r.Host)
	}
	if r.Dir == "" || !path.IsAbs(r.Dir) {
		return nil, fmt.Errorf("internal error: host %s has no absolute agent-vm directory (%q)", r.Host, r.Dir)
	}
	exe, err := d.executable()
	if err != nil {
		return nil, err
	}
	t := hostlink.Target{Addr: r.Addr, User: r.User, KeyFile: r.KeyFile, KnownHosts: r.KnownHosts}
	c, agent, err := hostlink.DialAgent(ctx, t, exe, r.Dir, func(err error) {
		d.Log.Warn("could not prune older copies of agent-vm's binary on the host", "host", r.Host, "error", err)
	})
	if err != nil {
		return nil, fmt.Errorf("reaching host %s: %w", r.Host, err)
	}
	return &hostLink{c: c, agent: agent, r: r}, nil
}

func (d *Driver) executable() (string, error) {
	self := d.Executable
	if self == nil {
		self = os.Executable
	}
	exe, err := self()
	if err != nil {
		return "", fmt.Errorf("finding agent-vm's own binary: %w", err)
	}
	return exe, nil
}

// call runs one verb on the host.
func (l *hostLink) call(ctx context.Context, req hostRequest) (hostResponse, error) {
	req.Dir = l.r.Dir
	b, err := json.Marshal(req)
	if err != nil {
		return hostResponse{}, err
	}
	out, err := hostlink.Runner{C: l.c}.Run(ctx, execx.Cmd{Path: l.agent, Args: []string{HostCommand}, Stdin: bytes.NewReader(b)})
	var res hostResponse
	if jerr := json.Unmarshal(out.Stdout, &res); jerr != nil {
		if err == nil {
			err = fmt.Errorf("agent-vm's binary there answered %q, not JSON: %w", execx.Tail(out.Stdout, 200), jerr)
		}
		return hostResponse{}, fmt.Errorf("asking host %s to %s %s: %w", l.r.Host, req.Verb, req.Machine.Name, err)
	}
	if res.Error != "" {
		return res, &hostError{msg: fmt.Sprintf("on host %s: %s", l.r.Host, res.Error), kind: errKinds[res.Kind]}
	}
	return res, nil
}

// hostMachine is m as the host sees it: its directories there, no
// forwards (they listen here), no credential files (their bytes travel in
// the request), and the egress proxy run by agent-vm's binary there.
func (l *hostLink) hostMachine(m driver.Machine) driver.Machine {
	dirs := hostDirs(l.r.Dir, m)
	h := m
	h.Remote, h.Forwards, h.Credentials, h.Adopted = nil, nil, nil, nil
	h.RunDir, h.LogsDir, h.Share.Source = dirs.Run, dirs.Logs, dirs.Workspace
	if m.Network != nil {
		n := *m.Network
		n.Dir, n.ExposedDir = dirs.Net, dirs.Exposed
		n.Proxy = slices.Clone(n.Proxy)
		if len(n.Proxy) > 0 {
			n.Proxy[0] = l.agent
		}
		if i := slices.Index(n.Proxy, "--dir"); i >= 0 && i+1 < len(n.Proxy) {
			n.Proxy[i+1] = dirs.Net
		}
		h.Network = &n
	}
	return h
}

// onHost runs verb for m on its host.
func (d *Driver) onHost(ctx context.Context, m driver.Machine, req hostRequest) (hostResponse, error) {
	l, err := d.linkTo(ctx, m)
	if err != nil {
		return hostResponse{}, err
	}
	defer l.Close()
	req.Machine = l.hostMachine(m)
	return l.call(ctx, req)
}

// startRemote starts m on its host: its directories made there, the base
// image uploaded into the host's pool (once per version) through
// libvirt's RPC on the link, then the host's start, then the forwards
// here.
func (d *Driver) startRemote(ctx context.Context, m driver.Machine, boot Boot, o driver.StartOptions) (*driver.Launch, error) {
	seed, err := os.ReadFile(boot.Seed)
	if err != nil {
		return nil, fmt.Errorf("starting %s: the seed: %w", m.Name, err)
	}
	l, err := d.linkTo(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", m.Name, err)
	}
	defer l.Close()
	hm := l.hostMachine(m)
	if _, err := l.call(ctx, hostRequest{Verb: verbPrepare, Machine: hm}); err != nil {
		return nil, fmt.Errorf("starting %s: %w", m.Name, err)
	}
	staged, err := d.stage(l, boot.Image)
	if err != nil {
		return nil, fmt.Errorf("starting %s: uploading the base image to host %s: %w", m.Name, l.r.Host, err)
	}
	req := hostRequest{Verb: verbStart, Machine: hm, Seed: seed, Options: o, TestEnv: map[string]string{}}
	for _, k := range proxyTestEnv {
		if v := os.Getenv(k); v != "" {
			req.TestEnv[k] = v
		}
	}
	req.Boot = &Boot{Image: staged, DiskBytes: boot.DiskBytes, MAC: boot.MAC}
	for _, c := range m.Credentials {
		b, err := os.ReadFile(c.File)
		if err != nil {
			return nil, fmt.Errorf("starting %s: credential %s: %w", m.Name, c.Name, err)
		}
		req.Creds = append(req.Creds, hostCred{Name: c.Name, Data: b})
	}
	if m.Network != nil {
		if req.NetFiles, err = netFiles(m.Network.Dir); err != nil {
			return nil, fmt.Errorf("starting %s: %w", m.Name, err)
		}
	}
	d.stopForwards(m, 0)
	if err := d.checkPortsFree(m); err != nil {
		return nil, err
	}
	res, err := l.call(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", m.Name, err)
	}
	if res.Launch == nil || res.Net == nil {
		return nil, fmt.Errorf("starting %s: host %s answered no launch or network", m.Name, l.r.Host)
	}
	starts := make([]func() error, 0, len(m.Forwards)+1)
	for _, f := range m.Forwards {
		starts = append(starts, func() error { return d.startForward(ctx, m, res.Net.Guest, f) })
	}
	if m.Network != nil && len(m.Network.Exposed) > 0 {
		starts = append(starts, func() error { return d.startExposedSockets(m, hm.Network.ExposedDir) })
	}
	for _, start := range starts {
		if err := start(); err != nil {
			d.stopForwards(m, 0)
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, serr := l.call(sctx, hostRequest{Verb: verbStop, Machine: hm})
			cancel()
			return nil, errors.Join(fmt.Errorf("starting %s: %w", m.Name, err), serr)
		}
	}
	return res.Launch, nil
}

// stage uploads img's files into the host's pool (once per version) and
// returns it as the host's start finds it: by version, its paths empty.
func (d *Driver) stage(l *hostLink, img Image) (Image, error) {
	lv, err := hostlink.Libvirt(l.c)
	if err != nil {
		return Image{}, err
	}
	defer lv.Disconnect()
	h := Host{L: lv, Pool: virtpool.Pool{L: lv, Dir: path.Join(l.r.Dir, "pool"), Name: hostPoolName(l.r.Dir)}}
	if _, err := h.Pool.Ensure(); err != nil {
		return Image{}, err
	}
	if _, _, _, err := h.upload(img); err != nil {
		return Image{}, err
	}
	img.Disk, img.Kernel, img.Initrd = "", "", ""
	return img, nil
}

// netFiles are the regular files of the proxy's directory dir here (its
// policy), which the host's copy of the directory starts from.
func netFiles(dir string) (map[string][]byte, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the network directory %s: %w", dir, err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out[e.Name()] = b
	}
	return out, nil
}

// inspectRemote is m's live state as its host says, and its network.
func (d *Driver) inspectRemote(ctx context.Context, m driver.Machine) (driver.Live, *hostResponse, error) {
	res, err := d.onHost(ctx, m, hostRequest{Verb: verbInspect})
	if err != nil {
		return driver.Live{}, nil, fmt.Errorf("reading the state of %s: %w", m.Name, err)
	}
	if res.Live == nil {
		return driver.Live{}, nil, fmt.Errorf("reading the state of %s: host %s answered none", m.Name, m.Remote.Host)
	}
	lv := res.Live.Live
	if res.Live.LaunchErr != "" {
		lv.LaunchErr = errors.New(res.Live.LaunchErr)
	}
	return lv, &res, nil
}

// PrepareHost makes m's directories on its host and returns where its
// workspace is to be cloned there (the path must not exist yet: the clone
// makes it). Destroy removes them again.
func (d *Driver) PrepareHost(ctx context.Context, m driver.Machine) (string, error) {
	if m.Remote == nil {
		return "", errors.New("internal error: preparing a host for a machine placed on this one")
	}
	res, err := d.onHost(ctx, m, hostRequest{Verb: verbPrepare})
	if err != nil {
		return "", fmt.Errorf("preparing host %s for %s: %w", m.Remote.Host, m.Name, err)
	}
	if res.Paths == nil {
		return "", fmt.Errorf("preparing host %s for %s: it answered no paths", m.Remote.Host, m.Name)
	}
	return res.Paths.Workspace, nil
}

// RemoveFromHost destroys m (as Destroy) and removes its directory on its
// host, the workspace with it: for a VM being destroyed, once its work is
// saved. Destroy alone keeps the directory (a reset makes a fresh disk and
// keeps the workspace).
func (d *Driver) RemoveFromHost(ctx context.Context, m driver.Machine) error {
	if m.Remote == nil {
		return errors.New("internal error: removing from a host a machine placed on this one")
	}
	d.stopForwards(m, 0)
	if _, err := d.onHost(ctx, m, hostRequest{Verb: verbRemove}); err != nil {
		return fmt.Errorf("removing %s from host %s: %w", m.Name, m.Remote.Host, err)
	}
	return nil
}
