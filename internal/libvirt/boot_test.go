package libvirt

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/iso9660"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
	"github.com/agent-vm/agent-vm/internal/virtpool"
)

// A real boot through libvirt's API, on this machine's libvirtd as the
// driver will boot on any host: agent-vm's base image uploaded to a pool
// (of the test's own), an overlay and a seed as volumes, the VM's own
// isolated network, the domain from Domain's XML, under TCG. The guest
// gets its address and the route to the doors' address by DHCP, answers
// SSH with the pinned host key at that address, shuts down cleanly, and
// Remove leaves no domain, volume or network of the VM's.
func TestBootThroughLibvirt(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM; skipped under -short")
	}
	tu.Need(t, os.Geteuid() == 0, "the system libvirtd needs root")
	img, err := image.Lookup(imageDir(), image.DefaultBuildName)
	tu.Need(t, err == nil, "no base image: run `agent-vm image build`")
	tu.Program(t, "virsh")
	libvirtd.ForTest(t)
	l := golibvirt.NewWithDialer(dialers.NewLocal())
	if err := l.ConnectToURI(golibvirt.QEMUSystem); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Disconnect() }) // after the cleanup below, which needs it

	id := state.NewID()
	name := "agent-vm-test-" + libvirtnetID(id)
	// libvirt's QEMU (libvirt-qemu) must reach the pool's files: every
	// directory above them searchable, which a t.TempDir is not.
	base, err := os.MkdirTemp("/var/tmp", "agent-vm-libvirt-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(base, 0o711)
	h := Host{L: l, Run: execx.OS{}, URI: libvirtd.URI, Pool: virtpool.Pool{L: l, Name: name, Dir: filepath.Join(base, "pool")}}
	t.Cleanup(func() {
		if err := h.Remove(context.Background(), name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if sp, err := l.StoragePoolLookupByName(name); err == nil {
			vols, _, _ := l.StoragePoolListAllVolumes(sp, 1, 0)
			for _, v := range vols {
				_ = l.StorageVolDelete(v, 0)
			}
			_ = l.StoragePoolDestroy(sp)
			_ = l.StoragePoolUndefine(sp)
		}
		os.RemoveAll(base)
	})

	client, _ := sshkeys.Generate("test client")
	hostKey, _ := sshkeys.Generate("test guest")
	keyDir := t.TempDir()
	if err := client.Write(filepath.Join(keyDir, "client")); err != nil {
		t.Fatal(err)
	}
	mac := "52:54:00:" + id[0:2] + ":" + id[2:4] + ":" + id[4:6]
	m := Machine{Name: name, UUID: id, Type: "qemu", CPUs: 2, MemoryMiB: 1024, DiskBytes: uint64(img.Manifest.VirtualSizeBytes),
		MAC: mac, Doors: netip.MustParseAddr("10.0.2.100"), Console: filepath.Join(t.TempDir(), "console.log")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	run, err := h.Up(ctx, m, Image{Version: "test-" + filepath.Base(img.Dir), Disk: img.Disk, Format: img.Format, Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline},
		seed(t, client, hostKey, id))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Up(ctx, m, Image{}, nil); err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Errorf("Up of a running domain: %v", err)
	}
	addr := net.JoinHostPort(run.Net.Guest.String(), "22")
	known := filepath.Join(keyDir, "known_hosts")
	os.WriteFile(known, []byte(hostlink.PinLine(addr, hostKey.Public)), 0o600)
	c, err := sshx.WaitReady(ctx, sshx.Target{Addr: addr, User: "dev", KeyFile: filepath.Join(keyDir, "client"), KnownHosts: known}, nil)
	if err != nil {
		b, _ := os.ReadFile(m.Console)
		t.Fatalf("the guest's SSH at %s: %v\nconsole ends:\n%s", addr, err, execx.TailLines(string(b), 30))
	}
	t.Logf("SSH answered %s after the start", time.Since(start).Round(time.Second))
	var out, errOut bytes.Buffer
	code, err := sshx.Run(ctx, c, "id -un; ip -4 route", strings.NewReader(""), &out, &errOut)
	c.Close()
	if err != nil || code != 0 || !strings.HasPrefix(out.String(), "dev\n") || !strings.Contains(out.String(), "10.0.2.100 via "+run.Net.Host.String()) ||
		strings.Contains(out.String(), "default") {
		t.Errorf("in the guest: exit %d %v\n%s%s", code, err, out.String(), errOut.String())
	}
	if err := h.Shutdown(ctx, name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if st, _, err := h.State(name); err != nil || st != golibvirt.DomainShutoff {
		t.Errorf("after Shutdown: state %v %v", st, err)
	}
	if err := h.Remove(ctx, name); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := h.State(name); st != golibvirt.DomainNostate {
		t.Errorf("the domain outlived Remove: %v", st)
	}
	for _, v := range []string{rootVol(name), seedVol(name)} {
		if f, err := h.Pool.Find(v); err != nil || f != nil {
			t.Errorf("volume %s outlived Remove: %v %v", v, f, err)
		}
	}
	if _, err := net.InterfaceByName(run.Net.Bridge); err == nil {
		t.Errorf("the bridge %s outlived Remove", run.Net.Bridge)
	}
}

func imageDir() string {
	d, _ := image.DefaultCacheDir()
	return d
}

func libvirtnetID(uuid string) string { return strings.ReplaceAll(uuid, "-", "")[:8] }

// seed is a minimal NoCloud seed: user dev with the client's key and the
// pinned host key (the base image's networkd does DHCP on any NIC).
func seed(t *testing.T, client, host sshkeys.Pair, id string) []byte {
	t.Helper()
	ud, err := json.Marshal(map[string]any{
		"users": []map[string]any{{"name": "dev", "shell": "/bin/bash", "sudo": "ALL=(ALL) NOPASSWD:ALL",
			"ssh_authorized_keys": []string{strings.TrimSpace(string(client.AuthorizedKey))}}},
		"ssh_keys":        map[string]string{"ed25519_private": string(host.PrivatePEM), "ed25519_public": strings.TrimSpace(string(host.AuthorizedKey))},
		"ssh_deletekeys":  true,
		"ssh_genkeytypes": []string{},
	})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := iso9660.Encode(context.Background(), &b, iso9660.Volume{ID: "cidata", ModTime: time.Unix(0, 0), Files: []iso9660.File{
		{Name: "user-data", Data: append([]byte("#cloud-config\n"), ud...)},
		{Name: "meta-data", Data: []byte("instance-id: " + id + "\nlocal-hostname: libvirt-test\n")},
	}}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
