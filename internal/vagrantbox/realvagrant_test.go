//go:build vagrantproof

package vagrantbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/iso9660"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
)

// testVagrantfile is the hand-written Vagrantfile of the real run. Like the
// box's, it reads its values from JSON beside it (vm.json), so no path is
// spliced into Ruby. It is what the driver's renderer will have to say, at
// the least: the box by name and version, no /vagrant share, the workspace
// over virtiofs (which needs shared memory backing), the forwarded SSH port
// on 127.0.0.1, our user and key (vagrant inserts no key of its own), the
// NoCloud seed as a CD-ROM, the serial console to a file, and the libvirt
// domain type (qemu = TCG where KVM does not work).
const testVagrantfile = `require "json"
vm = JSON.parse(File.read(File.join(__dir__, "vm.json")))
Vagrant.configure("2") do |config|
  config.vm.box = vm["box"]
  config.vm.box_version = vm["box_version"]
  config.vm.box_check_update = false
  config.vm.boot_timeout = 900
  config.vm.synced_folder ".", "/vagrant", disabled: true
  config.vm.synced_folder vm["workspace"], "/workspace", type: "virtiofs"
  config.vm.network "forwarded_port", id: "agent-ssh", guest: 22, host: vm["ssh_port"], host_ip: "127.0.0.1"
  config.ssh.username = "dev"
  config.ssh.private_key_path = vm["key"]
  config.ssh.insert_key = false
  config.vm.provider :libvirt do |l|
    l.driver = vm["driver"]
    l.memory = 1024
    l.cpus = 2
    l.suspend_mode = "pause"
    l.memorybacking :access, mode: "shared"
    l.memorybacking :source, type: "memfd"
    l.serial type: "file", source: { path: vm["serial"] }
    l.storage :file, device: :cdrom, path: vm["seed"]
  end
end
`

type testVM struct {
	Box        string `json:"box"`
	BoxVersion string `json:"box_version"`
	Workspace  string `json:"workspace"`
	SSHPort    int    `json:"ssh_port"`
	Key        string `json:"key"`
	Driver     string `json:"driver"`
	Serial     string `json:"serial"`
	Seed       string `json:"seed"`
}

// cloudConfig is the seed's user-data: user dev (uid 1000, the workspace's
// owner here) with our key, and the pinned host key.
type cloudConfig struct {
	Users      []cloudUser       `json:"users"`
	SSHPwauth  bool              `json:"ssh_pwauth"`
	SSHKeys    map[string]string `json:"ssh_keys"`
	DeleteKeys bool              `json:"ssh_deletekeys"`
	Genkeys    []string          `json:"ssh_genkeytypes"`
}

type cloudUser struct {
	Name              string   `json:"name"`
	UID               int      `json:"uid"`
	Shell             string   `json:"shell"`
	Sudo              string   `json:"sudo"`
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys"`
}

// TestRealVagrantUpUnderLibvirt is the proof the vagrant driver stands on:
// real libvirtd (started by the fixture when none answers), a real box made
// from agent-vm's base image, real vagrant and vagrant-libvirt, a real boot
// (TCG where KVM does not work). Timings are logged for the notes, never
// asserted.
func TestRealVagrantUpUnderLibvirt(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM through vagrant (minutes under TCG)")
	}
	// Built only with the vagrantproof tag (go test -tags vagrantproof
	// ./internal/vagrantbox): CI runs one vagrant boot sequence, agent-vm's
	// own (internal/cli); this one checks vagrant and the box alone.
	progs := map[string]string{}
	for _, p := range []string{"vagrant", "qemu-system-x86_64", "ssh"} {
		progs[p] = testutil.Program(t, p)
	}
	img := cachedImage(t)
	ctx := context.Background()
	run := execx.OS{}
	base := reachableTempDir(t)

	daemon := libvirtd.ForTest(t)
	t.Logf("libvirtd: started here %v; %s", daemon.Started, strings.ReplaceAll(daemon.Version, "\n", "; "))

	driver := "qemu"
	if r := (&accel.Prober{Run: run, QEMU: progs["qemu-system-x86_64"], Kernels: []string{img.Kernel}}).Probe(ctx); r.Accel == accel.KVM {
		driver = "kvm"
	} else {
		t.Logf("libvirt domain type qemu (TCG): %s", r.Reason)
	}

	home := filepath.Join(base, "vagrant-home")
	step := timer(t)
	box, err := Add(ctx, img, AddOptions{Run: run, Vagrant: progs["vagrant"], Home: home, WorkDir: base})
	if err != nil {
		t.Fatal(err)
	}
	step("vagrant box add (tar + add)")
	t.Cleanup(func() {
		if _, err := daemon.Virsh(context.Background(), "vol-delete", "--pool", "default", box.PoolVolume()); err != nil {
			t.Logf("deleting the box volume: %v", err)
		}
	})
	if err := CheckQEMUCanRead(filepath.Join(box.Dir(home), image.KernelFile)); err != nil {
		t.Fatal(err)
	}

	vm := writeVM(t, base, box, driver)
	vagrant := func(args ...string) string {
		t.Helper()
		res, err := run.Run(ctx, execx.Cmd{Path: progs["vagrant"], Args: args, Env: append(Env(home),
			"VAGRANT_CWD="+filepath.Join(base, "project"), "VAGRANT_DOTFILE_PATH="+filepath.Join(base, "dot"))})
		if err != nil {
			t.Fatalf("vagrant %s: %v\nserial console ends:\n%s", strings.Join(args, " "), err, serialTail(vm.Serial))
		}
		return string(res.Stdout)
	}
	t.Cleanup(func() {
		run.Run(context.Background(), execx.Cmd{Path: progs["vagrant"], Args: []string{"destroy", "-f"}, Env: append(Env(home),
			"VAGRANT_CWD="+filepath.Join(base, "project"), "VAGRANT_DOTFILE_PATH="+filepath.Join(base, "dot"))})
	})

	vagrant("validate")
	step("vagrant validate")
	vagrant("up", "--provider", "libvirt")
	step("vagrant up (first: box upload into the pool, boot, cloud-init, SSH, virtiofs mount)")
	if out := vagrant("ssh", "-c", "cat /workspace/hello && echo from-guest > /workspace/from-guest"); !strings.Contains(out, "hello from the host") {
		t.Errorf("vagrant ssh: the workspace does not show the host's file: %q", out)
	}
	step("vagrant ssh -c")
	if b, err := os.ReadFile(filepath.Join(vm.Workspace, "from-guest")); err != nil || string(b) != "from-guest\n" {
		t.Errorf("the guest's write to /workspace: %q, %v", b, err)
	}
	pinnedSSH(t, progs["ssh"], base, vm)
	step("ssh through the forwarded port, host key pinned")

	vagrant("suspend")
	step("vagrant suspend (pause)")
	if s := machineState(t, vagrant("status", "--machine-readable")); s != "paused" {
		t.Errorf("state after suspend: %q, want paused", s)
	}
	step("vagrant status --machine-readable")
	vagrant("resume")
	step("vagrant resume")
	vagrant("ssh", "-c", "true")
	step("vagrant ssh -c true")
	vagrant("halt")
	step("vagrant halt")
	if s := machineState(t, vagrant("status", "--machine-readable")); s != "shutoff" {
		t.Errorf("state after halt: %q, want shutoff", s)
	}
	vagrant("destroy", "-f")
	step("vagrant destroy -f")
	if s := machineState(t, vagrant("status", "--machine-readable")); s != "not_created" {
		t.Errorf("state after destroy: %q, want not_created", s)
	}
}

// cachedImage is agent-vm's built base image from the cache
// (AGENT_VM_TEST_IMAGE names another).
func cachedImage(t *testing.T) *image.Image {
	t.Helper()
	name := os.Getenv("AGENT_VM_TEST_IMAGE")
	if name == "" {
		name = image.DefaultBuildName
	}
	cache, err := image.DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	img, err := image.Lookup(cache, name)
	testutil.Need(t, err == nil, fmt.Sprintf("no base image: %v (run `agent-vm image build`)", err))
	return img
}

// reachableTempDir is a temp dir libvirt's QEMU (another user) can enter:
// t.TempDir is 0700.
func reachableTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "agent-vm-vagrant-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// writeVM writes the project (Vagrantfile, vm.json), the keys, the seed and
// the workspace.
func writeVM(t *testing.T, base string, box Box, driver string) testVM {
	t.Helper()
	secrets := filepath.Join(base, "secrets")
	if err := os.Mkdir(secrets, 0o700); err != nil {
		t.Fatal(err)
	}
	client, err := sshkeys.Generate("agent-vm-test")
	if err != nil {
		t.Fatal(err)
	}
	host, err := sshkeys.Generate("agent-vm-test-host")
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(secrets, "id_ed25519")
	if err := client.Write(key); err != nil {
		t.Fatal(err)
	}
	port := testutil.FreePort(t) // outside the SSH range VM tests beside this one pick from
	testutil.WriteFile(t, filepath.Join(secrets, "known_hosts"), sshkeys.KnownHostsLine(port, host.Public))

	ws := filepath.Join(base, "workspace")
	testutil.WriteFile(t, filepath.Join(ws, "hello"), "hello from the host\n")
	for _, p := range []string{ws, filepath.Join(ws, "hello")} {
		if err := os.Chown(p, 1000, 1000); err != nil { // dev's uid in the guest
			t.Fatal(err)
		}
	}
	seed := filepath.Join(base, "seed.iso") // 0600: it holds the host's private key
	writeSeed(t, seed, client, host)

	vm := testVM{Box: box.Name, BoxVersion: box.Version, Workspace: ws, SSHPort: port, Key: key,
		Driver: driver, Serial: filepath.Join(base, "serial.log"), Seed: seed}
	b, err := json.MarshalIndent(vm, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, filepath.Join(base, "project", "vm.json"), string(b))
	testutil.WriteFile(t, filepath.Join(base, "project", "Vagrantfile"), testVagrantfile)
	return vm
}

func writeSeed(t *testing.T, path string, client, host sshkeys.Pair) {
	t.Helper()
	cc := cloudConfig{
		Users: []cloudUser{{Name: "dev", UID: 1000, Shell: "/bin/bash", Sudo: "ALL=(ALL) NOPASSWD:ALL",
			SSHAuthorizedKeys: []string{strings.TrimSpace(string(client.AuthorizedKey))}}},
		SSHKeys:    map[string]string{"ed25519_private": string(host.PrivatePEM), "ed25519_public": strings.TrimSpace(string(host.AuthorizedKey))},
		DeleteKeys: true,
		Genkeys:    []string{},
	}
	ud, err := json.Marshal(cc)
	if err != nil {
		t.Fatal(err)
	}
	err = iso9660.Write(context.Background(), path, iso9660.Volume{ID: "cidata", ModTime: time.Unix(0, 0), Files: []iso9660.File{
		{Name: "user-data", Data: append([]byte("#cloud-config\n"), ud...)},
		{Name: "meta-data", Data: []byte("instance-id: vagrant-proof-1\nlocal-hostname: vagrant-proof\n")},
	}})
	if err != nil {
		t.Fatal(err)
	}
}

// pinnedSSH logs in through the forwarded port with OpenSSH, the host key
// pinned: vagrant's own ssh does StrictHostKeyChecking=no. vagrant-libvirt
// spawns the forwarding `ssh -L` and returns before it listens, so this
// retries for a while; on failure the forwarder's log is shown.
func pinnedSSH(t *testing.T, ssh, base string, vm testVM) {
	t.Helper()
	cmd := execx.Cmd{Path: ssh, Args: []string{
		"-F", "none", "-i", vm.Key, "-p", strconv.Itoa(vm.SSHPort), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile=" + filepath.Join(base, "secrets", "known_hosts"), "dev@127.0.0.1", "id -un"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	var res execx.Result
	for delay := 500 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		if res, err = (execx.OS{}).Run(ctx, cmd); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			logs, _ := filepath.Glob(filepath.Join(base, "dot", "machines", "default", "libvirt", "logs", "ssh-forwarding-*"))
			var b strings.Builder
			for _, l := range logs {
				c, _ := os.ReadFile(l)
				fmt.Fprintf(&b, "%s:\n%s\n", l, c)
			}
			t.Errorf("ssh through the forwarded port with the pinned host key: %v\nthe forwarders' logs:\n%s", err, b.String())
			return
		case <-time.After(delay):
		}
	}
	if got := strings.TrimSpace(string(res.Stdout)); got != "dev" {
		t.Errorf("ssh through the forwarded port: id -un says %q, want dev", got)
	}
}

// machineState parses `vagrant status --machine-readable`
// (timestamp,target,type,data...) for the default machine's state.
func machineState(t *testing.T, out string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		f := strings.SplitN(line, ",", 4)
		if len(f) == 4 && f[1] == "default" && f[2] == "state" {
			return f[3]
		}
	}
	t.Fatalf("no state in vagrant status --machine-readable: %q", out)
	return ""
}

func timer(t *testing.T) func(string) {
	last := time.Now()
	return func(what string) {
		t.Logf("%-70s %6.1fs", what, time.Since(last).Seconds())
		last = time.Now()
	}
}

func serialTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return execx.TailLines(string(b), 30)
}
