package hostpkgs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
)

func TestListIsWellFormed(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		progs := programs(arch)
		seen := map[string]bool{}
		for i, p := range progs {
			if seen[p.Name] {
				t.Errorf("%s: %q listed twice", arch, p.Name)
			}
			seen[p.Name] = true
			if i > 0 && progs[i-1].Name > p.Name && !strings.HasPrefix(p.Name, "qemu") && !strings.HasPrefix(progs[i-1].Name, "qemu") {
				t.Errorf("%s: %q is listed after %q: keep the list sorted", arch, p.Name, progs[i-1].Name)
			}
			if p.Need == 0 {
				t.Errorf("%q: needed for nothing", p.Name)
			}
			if len(p.Debian) == 0 && p.Note == "" {
				t.Errorf("%q: no Debian package and no note saying how to get it", p.Name)
			}
		}
	}
}

// The Go the list names is the Go go.mod asks for.
func TestGoVersionMatchesGoMod(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\ngo "+goVersion+".") && !strings.Contains(string(b), "\ngo "+goVersion+"\n") {
		t.Errorf("go.mod's go line is not %s; update goVersion in hostpkgs.go", goVersion)
	}
}

// aptHost is a FAKE at the exec boundary: a Debian 12 machine on which
// nothing but apt-get is installed. apt-get install "installs" the
// programs of the packages it is given (per provides); apt-cache knows the
// packages in index once apt-get update ran.
type aptHost struct {
	*execxtest.Fake
	updated  bool
	index    []string
	provides map[string][]string // package -> programs
}

func newAptHost(t *testing.T, index []string) *aptHost {
	h := &aptHost{Fake: execxtest.New(t), index: index, provides: map[string][]string{}}
	for _, p := range All() {
		if len(p.Debian) > 0 {
			pkg := p.Debian[len(p.Debian)-1] // bookworm: qemu-system-common has virtiofsd
			h.provides[pkg] = append(h.provides[pkg], p.Name)
		}
	}
	h.Installed(Apt, "/usr/bin/apt-get")
	h.On(Apt, func(c execxtest.Call) execxtest.Reply {
		switch c.Args[0] {
		case "update":
			h.updated = true
		case "install":
			for _, pkg := range c.Args {
				for _, prog := range h.provides[pkg] {
					h.Installed(prog, "/usr/bin/"+prog)
				}
			}
		}
		return execxtest.Reply{Stdout: "apt output\n"}
	})
	h.On("apt-cache", func(c execxtest.Call) execxtest.Reply {
		pkg := c.Args[len(c.Args)-1]
		if h.updated && slices.Contains(h.index, pkg) {
			return execxtest.Reply{Stdout: "Package: " + pkg + "\n"}
		}
		return execxtest.Reply{ExitCode: 100, Stderr: "E: No packages found"}
	})
	return h
}

func TestAptInstallsWhatIsMissingOnAFreshMachine(t *testing.T) {
	h := newAptHost(t, []string{"qemu-system-common"}) // bookworm: no virtiofsd package
	host := Host{Run: h, Root: t.TempDir()}
	var out bytes.Buffer
	p, err := host.Install(context.Background(), Run|Image, &out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"coreutils", "e2fsprogs", "git", "mmdebstrap", "qemu-system-common", "qemu-system-x86", "qemu-utils", "util-linux"}
	if !slices.Equal(p.Packages, want) {
		t.Errorf("packages %q, want %q", p.Packages, want)
	}
	var aptCalls []string
	for _, c := range h.Calls() {
		if c.Path == Apt {
			aptCalls = append(aptCalls, strings.Join(c.Args, " "))
			if !slices.Contains(c.Env, "DEBIAN_FRONTEND=noninteractive") {
				t.Errorf("apt-get %s without DEBIAN_FRONTEND=noninteractive", c.Args)
			}
		}
	}
	wantCalls := []string{"update -q", "install -y -q --no-install-recommends " + strings.Join(want, " ")}
	if !slices.Equal(aptCalls, wantCalls) {
		t.Errorf("apt-get calls %q, want %q", aptCalls, wantCalls)
	}
	if !strings.Contains(out.String(), "+ apt-get update -q\n") || !strings.Contains(out.String(), "apt output") {
		t.Errorf("the commands and their output are not shown: %q", out.String())
	}
	if m := host.Missing(For(Run | Image)); len(m) != 0 {
		t.Errorf("still missing after install: %s", Names(m))
	}
	// Idempotent: a second run installs nothing.
	n := len(h.Calls())
	if p, err := host.Install(context.Background(), Run|Image, &out); err != nil || !p.Empty() || len(h.Calls()) != n {
		t.Errorf("second install: plan %+v, err %v, %d new calls", p, err, len(h.Calls())-n)
	}
}

// Where the index knows the preferred package (Debian 13: virtiofsd), it
// is taken.
func TestAptPrefersTheFirstCandidateTheIndexKnows(t *testing.T) {
	h := newAptHost(t, []string{"virtiofsd", "qemu-system-common"})
	h.updated = true
	h.Installed("qemu-system-x86_64", "/usr/bin/qemu-system-x86_64").Installed("qemu-img", "/usr/bin/qemu-img").Installed("git", "/usr/bin/git")
	p, err := Host{Run: h, Root: t.TempDir()}.PlanFor(context.Background(), Run)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Packages, []string{"virtiofsd"}) {
		t.Errorf("packages %q, want [virtiofsd]", p.Packages)
	}
	if got, want := p.SudoLine(), "sudo apt-get update -q && sudo apt-get install -y -q --no-install-recommends virtiofsd"; got != want {
		t.Errorf("sudo line %q, want %q", got, want)
	}
}

func TestInstallSaysWhatIsStillMissing(t *testing.T) {
	h := newAptHost(t, nil)
	h.provides = map[string][]string{} // packages that install nothing
	_, err := Host{Run: h, Root: t.TempDir()}.Install(context.Background(), Run, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "still cannot be found") || !strings.Contains(err.Error(), "qemu-img") {
		t.Errorf("err = %v, want one naming what is still missing", err)
	}
}

func TestInstallReportsAFailingPackageManager(t *testing.T) {
	h := newAptHost(t, nil)
	h.On(Apt, func(c execxtest.Call) execxtest.Reply {
		return execxtest.Reply{ExitCode: 100, Stderr: "E: Could not get lock /var/lib/dpkg/lock-frontend"}
	})
	_, err := Host{Run: h, Root: t.TempDir()}.Install(context.Background(), Run, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "Could not get lock") {
		t.Errorf("err = %v, want apt-get's own words", err)
	}
}

func TestNixOSInstallsNothing(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "NIXOS"), nil, 0o644)
	f := execxtest.New(t) // no calls expected
	host := Host{Run: f, Root: root}
	if m := host.Manager(); m != NixOS {
		t.Fatalf("manager %q, want nixos", m)
	}
	p, err := host.Install(context.Background(), Run|Test, &bytes.Buffer{})
	if err != nil || len(p.Packages) != 0 || len(p.Missing) == 0 {
		t.Errorf("plan %+v, err %v: want missing programs and no packages", p, err)
	}
}

func TestUnknownPackageManager(t *testing.T) {
	_, err := Host{Run: execxtest.New(t), Root: t.TempDir()}.PlanFor(context.Background(), Run)
	if !errors.Is(err, ErrUnknownManager) {
		t.Errorf("err = %v, want ErrUnknownManager", err)
	}
}

func TestDnfPlan(t *testing.T) {
	f := execxtest.New(t).Installed(Dnf, "/usr/bin/dnf")
	p, err := Host{Run: f, Root: t.TempDir()}.PlanFor(context.Background(), Test)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(p.Packages, "openssh-clients") || slices.Contains(p.Packages, "nix-bin") {
		t.Errorf("dnf packages %q", p.Packages)
	}
	// nix and go have no Fedora package here: the plan says so.
	if n := Names(p.Unpackaged); !strings.Contains(n, "nix") || !strings.Contains(n, "go") {
		t.Errorf("unpackaged %q, want nix and go", n)
	}
	if c := p.Commands(); len(c) != 1 || c[0].Path != Dnf || c[0].Args[0] != "install" {
		t.Errorf("dnf commands %+v", c)
	}
}

// Programs outside PATH are found in their known places.
func TestFindLooksInKnownPaths(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "usr/lib/qemu"), 0o755)
	os.WriteFile(filepath.Join(root, "usr/lib/qemu/virtiofsd"), []byte("#!/bin/sh\n"), 0o755)
	p, _ := Lookup("virtiofsd")
	path, ok := Host{Run: execxtest.New(t), Root: root}.Find(p)
	if !ok || path != "/usr/lib/qemu/virtiofsd" {
		t.Errorf("Find = %q, %v", path, ok)
	}
}
