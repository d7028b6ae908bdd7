package main

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// What agent-vm printed for a real `--verbose --log-format json start`
// on this project's machines (stderr shortened).
const (
	startStdout = `started VM x (branch x): SSH after 2m30s, agent-mcp after 2m38s (tcg, workspace over virtiofs)
  shell: agent-vm shell x    (or ssh agent-vm-x, after ` + "`agent-vm ssh-config >> ~/.ssh/config`" + `)
  mcp:   http://127.0.0.1:8001/mcp    (client config: agent-vm mcp-config x)
  agent: healthy
`
	startStderr = `{"@level":"warn","@message":"KVM is not usable, running with TCG","@module":"agent-vm","@timestamp":"2026-11-22T01:21:57.621532Z"}
creating the VM's disk (0s)
starting QEMU (0s)
{"@level":"debug","@message":"qemu started","@module":"agent-vm.qemu","@timestamp":"2026-11-22T01:21:57.781370Z","accel":"tcg","pid":14758,"share":"virtiofs"}
waiting for SSH (10s): [    3.431347] evm: HMAC attrs: 0x1
{"@level":"debug","@message":"ssh ready","@module":"agent-vm","@timestamp":"2026-11-22T01:24:27.876185Z","after":150092984854}
waiting for agent-mcp (2m30s): no answer on the MCP port (agent-mcp not up yet?)
`
)

func TestParseStart(t *testing.T) {
	began := time.Date(2026, 11, 22, 1, 21, 57, 500000000, time.UTC)
	res := cmdResult{Line: "agent-vm start x", Stdout: startStdout, Stderr: startStderr, Start: began, End: began.Add(158 * time.Second)}
	got, err := parseStart(res)
	if err != nil {
		t.Fatal(err)
	}
	want := bootTimes{Wall: 158, SSHWall: 150.376185, SSHLaunch: 150.092984854, HealthLaunch: 158, Share: "virtiofs", Accel: "tcg",
		Said: "started VM x (branch x): SSH after 2m30s, agent-mcp after 2m38s (tcg, workspace over virtiofs)"}
	if math.Abs(got.SSHWall-want.SSHWall) > 1e-6 || math.Abs(got.SSHLaunch-want.SSHLaunch) > 1e-9 {
		t.Errorf("SSH times = %v (wall) %v (launch), want %v %v", got.SSHWall, got.SSHLaunch, want.SSHWall, want.SSHLaunch)
	}
	got.SSHWall, got.SSHLaunch = want.SSHWall, want.SSHLaunch
	if got != want {
		t.Errorf("parseStart = %+v, want %+v", got, want)
	}
}

// A resume prints its own summary line (no accelerator) and the same
// debug log.
func TestParseResume(t *testing.T) {
	began := time.Date(2026, 11, 23, 19, 0, 0, 0, time.UTC)
	res := cmdResult{Line: "agent-vm resume x", Start: began, End: began.Add(5 * time.Second),
		Stdout: "resumed VM x (branch x) from its saved state: SSH after 2.3s, agent-mcp after 4.1s (workspace over virtiofs)\n  shell: agent-vm shell x\n",
		Stderr: `{"@level":"debug","@message":"ssh ready","@module":"agent-vm","@timestamp":"2026-11-23T19:00:02.500000Z","after":2300000000}` + "\n"}
	got, err := parseStart(res)
	if err != nil {
		t.Fatal(err)
	}
	if got.Wall != 5 || math.Abs(got.SSHWall-2.5) > 1e-6 || got.SSHLaunch != 2.3 || got.HealthLaunch != 4.1 || got.Accel != "" || got.Share != "virtiofs" {
		t.Errorf("parseStart of a resume = %+v", got)
	}
	if bootPath(got.Said) != "cold first boot" || bootPath("started VM x (branch x) from the template: SSH after 3s") != "from the saved template" {
		t.Errorf("bootPath misreads %q", got.Said)
	}
}

func TestParseStartNeedsBothLines(t *testing.T) {
	for name, res := range map[string]cmdResult{
		"no summary line": {Stdout: "VM x (branch x) is already running\n", Stderr: startStderr},
		"no debug log":    {Stdout: startStdout, Stderr: "waiting for SSH (10s)\n"},
	} {
		if _, err := parseStart(res); err == nil {
			t.Errorf("%s: parseStart succeeded, want an error", name)
		}
	}
}

// benchOutput is `go test -v -bench` output of internal/mcpproxy with the
// npm packages missing.
const benchOutput = `goos: linux
goarch: amd64
pkg: github.com/agent-vm/agent-vm/internal/mcpproxy
cpu: Intel(R) Xeon(R) Processor
BenchmarkDirectStdio
BenchmarkDirectStdio/testserver
BenchmarkDirectStdio/testserver-2         	    2000	     30457 ns/op
BenchmarkDirectStdio/everything
    bench_test.go:85: npm packages not installed (npm ci --prefix internal/mcpproxy/testdata/node)
--- SKIP: BenchmarkDirectStdio/everything
BenchmarkProxy50Sessions/testserver-2     	    2000	    214000 ns/op	       275.0 open-50-sessions-ms
BenchmarkHTTPBaseline-2                   	    2000	     70900 ns/op
PASS
ok  	github.com/agent-vm/agent-vm/internal/mcpproxy	4.2s
`

func TestParseBench(t *testing.T) {
	results, skipped := parseBench(benchOutput)
	if len(results) != 3 {
		t.Fatalf("parsed %d results, want 3: %+v", len(results), results)
	}
	if r := results[0]; r.Name != "BenchmarkDirectStdio/testserver" || r.N != 2000 || r.Metrics["ns/op"] != 30457 {
		t.Errorf("first result %+v", r)
	}
	if r := results[1]; r.Name != "BenchmarkProxy50Sessions/testserver" || r.Metrics["open-50-sessions-ms"] != 275 || r.Metrics["ns/op"] != 214000 {
		t.Errorf("custom metric not read: %+v", r)
	}
	if r := results[2]; r.Name != "BenchmarkHTTPBaseline" {
		t.Errorf("name keeps its -GOMAXPROCS suffix: %q", r.Name)
	}
	if got := skipped["BenchmarkDirectStdio/everything"]; !strings.HasPrefix(got, "npm packages not installed") {
		t.Errorf("skip reason %q, want the benchmark's own", got)
	}
}

// vmArgv is the QEMU command line agent-vm ran for a VM (read from /proc).
func vmArgv() []string {
	return strings.Fields(`qemu-system-x86_64 -name agent-vm-x -uuid 592bb834-9a70-4b3d-8368-8166cf77ef37 -machine q35 -smp 1 -m 1024M -nodefaults -display none -vga none -device virtio-rng-pci -accel tcg,tb-size=256 -cpu max -object memory-backend-memfd,id=agentvm-mem,size=1024M,share=on -numa node,memdev=agentvm-mem -kernel /img/vmlinuz -initrd /img/initrd.img -append root=/dev/vda -drive file=/s/x/disk.qcow2,if=virtio,format=qcow2,discard=unmap -drive file=/s/x/seed.iso,if=virtio,format=raw,readonly=on -netdev user,id=agentvm-net,hostfwd=tcp:127.0.0.1:2223-:22,hostfwd=tcp:127.0.0.1:8001-:8000 -device virtio-net-pci,netdev=agentvm-net,mac=52:54:00:12:34:56 -chardev socket,id=agentvm-fs,path=/s/x/run/virtiofsd.sock -device vhost-user-fs-pci,chardev=agentvm-fs,tag=workspace -fw_cfg name=opt/io.systemd.credentials/agent-vm.mcp-token,file=/s/x/secrets/mcp-token -serial file:/s/x/logs/console.log -monitor none -qmp unix:/s/x/run/qmp.sock,server=on,wait=off -pidfile /s/x/run/qemu.pid`)
}

func TestBareArgv(t *testing.T) {
	f := bareFiles{Disk: "/b/disk.qcow2", Seed: "/b/seed.iso", Console: "/b/console.log", SSHPort: 40000}
	got, err := bareArgv(vmArgv(), f, "bench-bare-x")
	if err != nil {
		t.Fatal(err)
	}
	want := `qemu-system-x86_64 -name bench-bare-x -machine q35 -smp 1 -m 1024M -nodefaults -display none -vga none -device virtio-rng-pci -accel tcg,tb-size=256 -cpu max -kernel /img/vmlinuz -initrd /img/initrd.img -append root=/dev/vda -drive file=/b/disk.qcow2,if=virtio,format=qcow2,discard=unmap -drive file=/b/seed.iso,if=virtio,format=raw,readonly=on -netdev user,id=agentvm-net,hostfwd=tcp:127.0.0.1:40000-:22 -device virtio-net-pci,netdev=agentvm-net,mac=52:54:00:12:34:56 -serial file:/b/console.log -monitor none`
	if g := strings.Join(got, " "); g != want {
		t.Errorf("bare argv:\n got %s\nwant %s", g, want)
	}
	if d, err := overlayPath(vmArgv()); err != nil || d != "/s/x/disk.qcow2" {
		t.Errorf("overlayPath = %q, %v", d, err)
	}
	if s, err := seedPath(vmArgv()); err != nil || s != "/s/x/seed.iso" {
		t.Errorf("seedPath = %q, %v", s, err)
	}
}

func TestBareArgvRefusesWhatItCannotReuse(t *testing.T) {
	var noSeed []string
	for i, a := range vmArgv() {
		if strings.Contains(a, "seed.iso") {
			noSeed = append(vmArgv()[:i-1:i-1], vmArgv()[i+1:]...)
		}
	}
	if _, err := bareArgv(noSeed, bareFiles{SSHPort: 1}, "b"); err == nil {
		t.Error("bareArgv without a seed drive succeeded, want an error")
	}
}

func TestRewriteKnownHosts(t *testing.T) {
	dir := t.TempDir()
	from, to := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(from, []byte("[127.0.0.1]:2223 ssh-ed25519 AAAAkey\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rewriteKnownHosts(from, to, 2223, 40000); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(to); string(b) != "[127.0.0.1]:40000 ssh-ed25519 AAAAkey\n" {
		t.Errorf("rewritten known_hosts %q", b)
	}
	if err := rewriteKnownHosts(from, to, 9999, 1); err == nil {
		t.Error("a known_hosts without the port's entry was accepted")
	}
}

func TestP6Script(t *testing.T) {
	for _, round := range []int{1, 2} {
		script := p6Round(round)
		// Syntax, and shellcheck's verdict where it is installed.
		if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
			t.Fatalf("round %d script does not parse: %v\n%s", round, err, out)
		}
		if _, err := exec.LookPath("shellcheck"); err == nil {
			cmd := exec.Command("shellcheck", "-s", "sh", "-")
			cmd.Stdin = strings.NewReader(script)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("shellcheck on round %d: %v\n%s", round, err, out)
			}
		}
		var measures []string
		for _, l := range strings.Split(script, "\n") {
			if strings.HasPrefix(l, "measure ") {
				measures = append(measures, strings.Join(strings.Fields(l)[1:3], " "))
			}
		}
		first, second := "ws", "disk"
		if round == 2 {
			first, second = "disk", "ws"
		}
		want := []string{"write " + first, "write " + second, "read " + first, "read " + second,
			"untar " + first, "untar " + second, "rm " + first, "rm " + second,
			"gitcold " + first, "gitwarm " + first, "gitcold " + second, "gitwarm " + second}
		if strings.Join(measures, ",") != strings.Join(want, ",") {
			t.Errorf("round %d measures\n %v\nwant %v", round, measures, want)
		}
	}
	for _, name := range []string{"p6Setup", "p6Prelude"} {
		script := map[string]string{"p6Setup": p6Setup, "p6Prelude": p6Prelude}[name]
		if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
			t.Errorf("%s does not parse: %v\n%s", name, err, out)
		}
	}
}

func TestParseP6(t *testing.T) {
	var out strings.Builder
	for _, o := range p6Ops() {
		out.WriteString("result " + o.op + " ws 100.5 102.0\n")
		out.WriteString("result " + o.op + " disk 200.0 200.5\n")
	}
	times := map[string]map[string][]float64{}
	if err := parseP6("noise\n"+out.String(), times); err != nil {
		t.Fatal(err)
	}
	if got := times["untar"]["ws"]; len(got) != 1 || got[0] != 1.5 {
		t.Errorf("untar on the workspace = %v, want [1.5]", got)
	}
	if got := times["gitwarm"]["disk"]; len(got) != 1 || got[0] != 0.5 {
		t.Errorf("warm git status on disk = %v, want [0.5]", got)
	}
	if err := parseP6("result write ws 1 2\n", map[string]map[string][]float64{}); err == nil {
		t.Error("a round with missing timings was accepted")
	}
}
