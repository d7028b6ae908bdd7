package cloudinit

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// guestScripts returns the embedded shell scripts by name.
func guestScripts(t *testing.T) map[string]string {
	t.Helper()
	scripts := map[string]string{}
	entries, err := guestFS.ReadDir("guest")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := guestFS.ReadFile("guest/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(string(b), "#!/bin/sh\n") {
			scripts[e.Name()] = string(b)
		}
	}
	if len(scripts) != 8 {
		t.Fatalf("found %d guest scripts, want 8", len(scripts))
	}
	return scripts
}

func TestGuestScriptsPassShellcheck(t *testing.T) {
	shellcheck := testutil.Program(t, "shellcheck")
	for name := range guestScripts(t) {
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{
			Path: shellcheck, Args: []string{"--shell=sh", "--severity=style", filepath.Join("guest", name)},
		})
		if err != nil {
			t.Errorf("shellcheck %s:\n%s%v", name, res.Stdout, err)
		}
	}
}

// TestGuestUnitsVerify runs systemd-analyze verify on the units, inside a
// scratch root that holds the scripts they run and the host's own units
// (Debian 12's systemd is the guest's). Unknown keys and bad values are
// warnings there, so any output fails the test.
func TestGuestUnitsVerify(t *testing.T) {
	analyze := testutil.Program(t, "systemd-analyze")
	hostUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(hostUnits, "multi-user.target")); err != nil {
		testutil.SkipOrFail(t, "no systemd units in %s to verify against (apt-get install systemd)", hostUnits)
	}
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr/lib/systemd"), 0o755))
	must(copyTree(filepath.Join(root, "usr/lib/systemd/system"), hostUnits))
	must(os.Symlink("usr/lib", filepath.Join(root, "lib")))
	must(os.Symlink("usr/bin", filepath.Join(root, "bin")))
	must(os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/bin/umount"), []byte("#!/bin/sh\n"), 0o755))

	seed, err := Render(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	var units []string
	for _, f := range parseUserData(t, seed.UserData).WriteFiles {
		if f.Encoding != "" {
			continue
		}
		dst := filepath.Join(root, f.Path)
		must(os.MkdirAll(filepath.Dir(dst), 0o755))
		mode, err := strconv.ParseUint(f.Permissions, 8, 32)
		must(err)
		must(os.WriteFile(dst, []byte(f.Content), fs.FileMode(mode)))
		if strings.HasSuffix(f.Path, ".service") {
			units = append(units, dst)
		}
	}
	if len(units) != 3 {
		t.Fatalf("found %d units in write_files, want 3", len(units))
	}
	res, err := execx.OS{}.Run(context.Background(), execx.Cmd{
		Path: analyze, Args: append([]string{"verify", "--man=no", "--root=" + root}, units...), Dir: root,
	})
	out := strings.TrimSpace(string(res.Stdout) + string(res.Stderr))
	// The copied unit tree holds symlinks that leave it; their complaints
	// are about the scratch root, not our units.
	var complaints []string
	for _, line := range strings.Split(out, "\n") {
		if line != "" && !strings.HasPrefix(line, "Failed to resolve symlink") {
			complaints = append(complaints, line)
		}
	}
	if err != nil || len(complaints) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, strings.Join(complaints, "\n"))
	}
}

// TestGuestFilesAgreeWithTheGo checks that the static guest files use the
// names the Go side exports to the launcher.
func TestGuestFilesAgreeWithTheGo(t *testing.T) {
	s := guestScripts(t)
	read := func(name string) string {
		b, err := guestFS.ReadFile("guest/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	checks := []struct{ file, want string }{
		{"mount-workspace", "ninep_options=" + NinePMountOptions + "\n"},
		{"mount-workspace", "tag=" + WorkspaceTag + "\n"},
		{"mount-workspace", "dir=" + WorkspaceDir + "\n"},
		{"setup", "/sys/firmware/qemu_fw_cfg/by_name/" + MCPTokenFwCfgName + "/raw"},
		{"setup", "/run/credentials/@system/" + strings.TrimPrefix(MCPTokenFwCfgName, "opt/io.systemd.credentials/")},
		{"setup", "for label in " + SeedLabel + " " + strings.ToUpper(SeedLabel) + "; do"},
		{"setup", `"$seed_dir/` + AgentBinaryName + `"`},
		{"setup", cloudInitDisabledFile},
		{"agent-mcp-start", "--health-path " + MCPHealthPath + " "},
		{"agent-mcp-start", "${AGENT_MCP_PORT}"},
		{"agent-mcp-start", "${AGENT_MCP_ALLOW_ORIGINS:-}"},
		{"agent-mcp-start", "/etc/agent-vm/mcp.json"},
		{mcpUnit, "User=" + UserName + "\n"},
		{mcpUnit, "Group=" + UserName + "\n"},
		{mcpUnit, "ExecStart=" + libDir + "/agent-mcp-start\n"},
		{mcpUnit, "EnvironmentFile=" + etcDir + "/agent-mcp.env\n"},
		{mcpUnit, "LoadCredential=mcp-token:/run/agent-vm/mcp-token\n"},
		{mcpUnit, "Requires=" + setupUnit + " " + workspaceUnit + "\n"},
		{setupUnit, "ExecStart=" + libDir + "/setup\n"},
		{workspaceUnit, "ExecStart=" + libDir + "/mount-workspace\n"},
	}
	for _, c := range checks {
		text, ok := s[c.file]
		if !ok {
			text = read(c.file)
		}
		if !strings.Contains(text, c.want) {
			t.Errorf("guest/%s lacks %q", c.file, c.want)
		}
	}
	env := mcpEnv(testConfig(t))
	for _, v := range []string{"AGENT_MCP_PORT=", "AGENT_MCP_ALLOW_ORIGINS="} {
		if !strings.Contains(env, "\n"+v) {
			t.Errorf("agent-mcp.env lacks %s:\n%s", v, env)
		}
	}
	// The hardening the NixOS module has (seed 002), by name.
	unit := read(mcpUnit)
	for _, k := range []string{
		"NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "ProtectKernelTunables=yes",
		"ProtectKernelModules=yes", "ProtectControlGroups=yes", "RestrictSUIDSGID=yes", "RestrictNamespaces=yes",
		"LockPersonality=yes", "PrivateTmp=yes", "PrivateDevices=yes", "ReadWritePaths=/workspace",
		"Restart=always", "StartLimitBurst=", "KillMode=mixed", "TimeoutStopSec=30s", "WorkingDirectory=/workspace",
		"StateDirectory=agent-mcp", "CacheDirectory=agent-mcp", "Environment=HOME=/var/lib/agent-mcp",
	} {
		if !strings.Contains(unit, "\n"+k) {
			t.Errorf("agent-mcp.service lacks %s", k)
		}
	}
	// Nothing from a Config may be spliced into the static files.
	for name, text := range s {
		if strings.Contains(text, "{{") {
			t.Errorf("guest/%s looks like a template", name)
		}
	}
}

// TestInstallAgent runs guest/setup's install_agent (taken out of the
// script, with its variables pointed into a temporary directory) under a
// real sh: the binary is read from the seed only when the digest the guest
// kept is not the seed's, and the digest kept is always that of the binary
// installed.
func TestInstallAgent(t *testing.T) {
	sh := testutil.Program(t, "sh")
	script := guestScripts(t)["setup"]
	start := strings.Index(script, "\ninstall_agent() {\n")
	end := strings.Index(script[start+1:], "\n}\n")
	if start < 0 || end < 0 {
		t.Fatal("guest/setup has no install_agent() { ... } function")
	}
	fn := script[start+1 : start+1+end+3]
	dir := t.TempDir()
	seed, agent, kept := filepath.Join(dir, "seed"), filepath.Join(dir, "bin", "agent-vm"), filepath.Join(dir, "state", "agent-vm.sha256")
	if err := os.Mkdir(seed, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return "(none)"
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	install := func() string {
		t.Helper()
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: sh, Args: []string{"-euc", `
status=0
log() { echo "log: $*"; }
error() { echo "error: $*"; status=1; }
` + fn + `
install_agent
exit "$status"`, "install-agent"}, Env: []string{"seed_dir=" + seed, "agent=" + agent, "agent_digest=" + kept, "PATH=" + os.Getenv("PATH")}})
		out := strings.TrimSpace(string(res.Stdout) + string(res.Stderr))
		if err != nil {
			t.Fatalf("install_agent: %v\n%s", err, out)
		}
		return out
	}
	for _, c := range []struct {
		name                       string
		seedBin, seedDigest        string // "" for none on the seed
		installed, keptDigest      string // "" for none in the guest
		wantOut, wantBin, wantKept string
	}{
		{"first boot", "v1", "d1\n", "", "", "log: installed " + agent + " from the seed", "v1", "d1\n"},
		{"same digest: the seed's binary is not read", "v2", "d1\n", "v1", "d1\n", "", "v1", "d1\n"},
		{"new digest", "v2", "d2\n", "v1", "d1\n", "log: installed " + agent + " from the seed", "v2", "d2\n"},
		{"new digest, same binary: only the digest kept", "v1", "d2\n", "v1", "d1\n", "", "v1", "d2\n"},
		{"kept digest but no binary", "v1", "d1\n", "", "d1\n", "log: installed " + agent + " from the seed", "v1", "d1\n"},
		{"a seed without a digest is compared, and no digest kept", "v2", "", "v1", "d1\n", "log: installed " + agent + " from the seed", "v2", "(none)"},
		{"a seed without a digest, the same binary", "v1", "", "v1", "d1\n", "", "v1", "(none)"},
		{"no binary on the seed", "", "d1\n", "v1", "d1\n", "log: the seed carries no agent-vm; keeping " + agent + " as it is", "v1", "d1\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, f := range []struct{ path, text string }{
				{filepath.Join(seed, AgentBinaryName), c.seedBin}, {filepath.Join(seed, AgentDigestName), c.seedDigest},
				{agent, c.installed}, {kept, c.keptDigest},
			} {
				if err := os.Remove(f.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
					t.Fatal(err)
				}
				if f.text != "" {
					write(f.path, f.text)
				}
			}
			if out := install(); out != c.wantOut {
				t.Errorf("said %q, want %q", out, c.wantOut)
			}
			if got := read(agent); got != c.wantBin {
				t.Errorf("installed binary %q, want %q", got, c.wantBin)
			}
			if got := read(kept); got != c.wantKept {
				t.Errorf("kept digest %q, want %q", got, c.wantKept)
			}
		})
	}
}

// TestEnsurePackages runs guest/ensure-packages inside the cloud-init root
// filesystem. With every package present it must not touch apt at all; with
// one missing it installs only that one: from the image's package lists
// while their stamp is younger than a day (and when that install fails,
// after an update), else after an update. apt-get is replaced by a
// recording FAKE (a shell script first on PATH, whose install fails while
// a file says so), since a real install is not what is under test.
func TestEnsurePackages(t *testing.T) {
	rootfs := cloudInitRootfs(t)
	dir, err := os.MkdirTemp(filepath.Join(rootfs, "tmp"), "ensure-packages-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	inside := "/tmp/" + filepath.Base(dir)
	script, err := guestFS.ReadFile("guest/ensure-packages")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ensure-packages"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	fake := "#!/bin/sh\n# FAKE apt-get: records its arguments; its install fails once for each line of fail-install.\n" +
		"echo \"$*\" >>" + inside + "/apt-calls\n" +
		"if [ \"$1\" = install ] && [ -s " + inside + "/fail-install ]; then sed -i 1d " + inside + "/fail-install; exit 100; fi\n"
	if err := os.WriteFile(filepath.Join(dir, "apt-get"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	// The stamp of the image's package lists, as the test sets it; the
	// root filesystem's own (a copy of the base image's) is put back.
	stamp := filepath.Join(rootfs, "var", "lib", "agent-vm", "package-lists")
	if old, err := os.Stat(stamp); err == nil {
		t.Cleanup(func() { _ = os.WriteFile(stamp, nil, 0o644); _ = os.Chtimes(stamp, old.ModTime(), old.ModTime()) })
	} else {
		t.Cleanup(func() { _ = os.Remove(stamp) })
	}
	setStamp := func(age time.Duration) {
		t.Helper()
		if age < 0 {
			if err := os.Remove(stamp); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			return
		}
		if err := os.MkdirAll(filepath.Dir(stamp), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(stamp, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		if err := os.Chtimes(stamp, at, at); err != nil {
			t.Fatal(err)
		}
	}
	run := func(failInstalls int, pkgs ...string) (calls, out string) {
		t.Helper()
		_ = os.Remove(filepath.Join(dir, "apt-calls"))
		if err := os.WriteFile(filepath.Join(dir, "fail-install"), []byte(strings.Repeat("x\n", failInstalls)), 0o644); err != nil {
			t.Fatal(err)
		}
		args := append([]string{rootfs, "env", "PATH=" + inside + ":/usr/sbin:/usr/bin:/sbin:/bin", inside + "/ensure-packages"}, pkgs...)
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: "chroot", Args: args})
		out = string(res.Stdout) + string(res.Stderr)
		if err != nil {
			t.Fatalf("ensure-packages %v: %v\n%s", pkgs, err, out)
		}
		c, _ := os.ReadFile(filepath.Join(dir, "apt-calls"))
		return string(c), out
	}
	setStamp(time.Hour)
	if calls, out := run(0, "cloud-init", "systemd"); out != "" || calls != "" {
		t.Errorf("with everything installed it printed %q and ran apt-get: %q", out, calls)
	}
	const update, install = "update -q\n", "install -y -q --no-install-recommends agent-vm-no-such-package\n"
	for _, c := range []struct {
		name  string
		age   time.Duration // of the stamp; < 0: none
		fails int
		want  string
	}{
		{"no stamp (another image)", -1, 0, update + install},
		{"lists of two days ago", 48 * time.Hour, 0, update + install},
		{"lists of an hour ago", time.Hour, 0, install},
		{"lists of an hour ago that fail the install", time.Hour, 1, install + update + install},
	} {
		setStamp(c.age)
		calls, out := run(c.fails, "cloud-init", "agent-vm-no-such-package")
		if calls != c.want {
			t.Errorf("%s: apt-get calls:\n%s\nwant:\n%s(output %q)", c.name, calls, c.want, out)
		}
	}
	// After an update the stamp is new: the next install uses the lists.
	setStamp(48 * time.Hour)
	run(0, "agent-vm-no-such-package")
	if calls, _ := run(0, "agent-vm-no-such-package"); calls != install {
		t.Errorf("after an update, apt-get calls:\n%s\nwant:\n%s", calls, install)
	}
	// An install that fails after the update fails the script.
	setStamp(-1)
	args := []string{rootfs, "env", "PATH=" + inside + ":/usr/sbin:/usr/bin:/sbin:/bin", inside + "/ensure-packages", "agent-vm-no-such-package"}
	if err := os.WriteFile(filepath.Join(dir, "fail-install"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (execx.OS{}).Run(context.Background(), execx.Cmd{Path: "chroot", Args: args}); err == nil {
		t.Error("an install that failed after the update did not fail ensure-packages")
	}
}

// copyTree copies regular files, directories and symlinks (as they are) from
// src to dst. (os.CopyFS refuses symlinks before Go 1.25.)
func copyTree(dst, src string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o644)
		}
		return nil // sockets and the like: not units
	})
}

// TestCACertsLeavesWhatUpdateCACertificatesWould runs guest/ca-certs, as
// bootcmd does, in a real Debian root (chroot, with private copies of its
// certificate directories bind-mounted in a mount namespace), then
// update-ca-certificates --fresh on the same state: the two must agree, and
// OpenSSL must find each certificate through both the bundle and the hash
// links, named by the host (subjectHash) or by the guest's openssl. Then again (nothing changes), and with one certificate fewer (the
// other leaves the bundle).
func TestCACertsLeavesWhatUpdateCACertificatesWould(t *testing.T) {
	rootfs := cloudInitRootfs(t)
	unshare := testutil.Program(t, "unshare")
	script, err := guestFS.ReadFile("guest/ca-certs")
	if err != nil {
		t.Fatal(err)
	}
	ca2, _, _ := testutil.SelfSigned(t, "agent-vm test second CA", true)
	pems := []string{strings.TrimSpace(readFixture(t, "host-ca.pem")), strings.TrimSpace(ca2)}

	work := t.TempDir()
	certs, local := filepath.Join(work, "certs"), filepath.Join(work, "local")
	if err := copyTree(certs, filepath.Join(rootfs, "etc", "ssl", "certs")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(local, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, p := range pems {
		if err := os.WriteFile(filepath.Join(work, "ca"+strconv.Itoa(i)+".pem"), []byte(p+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// in runs a shell command in the chroot with the copies mounted; the
	// test's work directory is /work there.
	in := func(cmd string, args ...string) string {
		t.Helper()
		mounts := `set -e; r=$1; w=$2; shift 2
mount --bind "$w/certs" "$r/etc/ssl/certs"
mount --bind "$w/local" "$r/usr/local/share/ca-certificates"
mkdir -p "$r/work"; mount --bind "$w" "$r/work"
exec chroot "$r" sh -c "$@"`
		argv := append([]string{"--mount", "--propagation", "private", "sh", "-c", mounts, "mounts", rootfs, work, cmd, "sh"}, args...)
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: unshare, Args: argv})
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		return string(res.Stdout)
	}
	snapshot := func() map[string]string {
		t.Helper()
		got := map[string]string{}
		for _, dir := range []string{certs, local} {
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				p := filepath.Join(dir, e.Name())
				if link, err := os.Readlink(p); err == nil {
					got[p] = "-> " + link
				} else if b, err := os.ReadFile(p); err == nil {
					got[p] = string(b)
				} else {
					t.Fatal(err)
				}
			}
		}
		return got
	}
	verify := func(i int) string {
		return in(`openssl verify -no-CApath -CAfile /etc/ssl/certs/ca-certificates.crt "$1" && openssl verify -no-CAfile -CApath /etc/ssl/certs "$1" || true`, "/work/ca"+strconv.Itoa(i)+".pem")
	}
	// run gives the script each certificate with its subject hash, or
	// with - (the guest's openssl names it) for those in guestHashes.
	run := func(guestHashes map[int]bool, pems ...string) {
		var args []string
		for i, p := range pems {
			h, err := subjectHash(p)
			if err != nil {
				t.Fatal(err)
			}
			if guestHashes[i] {
				h = "-"
			}
			args = append(args, h, p)
		}
		in(string(script), args...)
	}

	run(map[int]bool{1: true}, pems...)
	for i := range pems {
		if out := verify(i); strings.Count(out, ": OK") != 2 {
			t.Errorf("certificate %d is not trusted through both the bundle and the hash links:\n%s", i, out)
		}
	}
	ours := snapshot()
	in("update-ca-certificates --fresh >/dev/null 2>&1")
	if theirs := snapshot(); !maps.Equal(ours, theirs) {
		for p, v := range theirs {
			if ours[p] != v {
				t.Errorf("%s: update-ca-certificates left %.80q, ca-certs %.80q", p, v, ours[p])
			}
		}
		for p := range ours {
			if _, ok := theirs[p]; !ok {
				t.Errorf("%s: ca-certs made it, update-ca-certificates did not", p)
			}
		}
	}

	run(nil, pems...)
	if again := snapshot(); !maps.Equal(ours, again) {
		t.Error("a second run with the same certificates changed the state")
	}

	run(nil, pems[0])
	if out := verify(0); strings.Count(out, ": OK") != 2 {
		t.Errorf("the certificate still given is no longer trusted:\n%s", out)
	}
	if out := verify(1); strings.Contains(out, ": OK") {
		t.Errorf("the certificate no longer given is still trusted:\n%s", out)
	}
}
