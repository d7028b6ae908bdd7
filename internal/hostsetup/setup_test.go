package hostsetup

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
)

// setupHost is a FAKE at the exec boundary: a Debian machine with apt-get
// and nothing else; apt-get install "installs" every program it is asked
// for. The image build is a recording stand-in too.
type setupHost struct {
	fake   *execxtest.Fake
	apt    []string // apt-get calls
	builds int
	asked  [][]string
}

func newSetupHost(t *testing.T) *setupHost {
	s := &setupHost{fake: execxtest.New(t).Installed(hostpkgs.Apt, "/usr/bin/apt-get")}
	s.fake.On(hostpkgs.Apt, func(c execxtest.Call) execxtest.Reply {
		s.apt = append(s.apt, strings.Join(c.Args, " "))
		if c.Args[0] == "install" {
			for _, p := range hostpkgs.All() {
				s.fake.Installed(p.Name, "/usr/bin/"+p.Name)
			}
		}
		return execxtest.Reply{}
	})
	s.fake.On("apt-cache", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{ExitCode: 100} })
	return s
}

func (s *setupHost) options(t *testing.T, root bool, answer *bool) Options {
	o := Options{Need: hostpkgs.Run | hostpkgs.Image, ImageDir: t.TempDir(), Root: root, Out: &bytes.Buffer{},
		Build: func(context.Context) (*image.Image, error) {
			s.builds++
			return &image.Image{Disk: "/images/disk.qcow2"}, nil
		}}
	if answer != nil {
		o.Consent = func(actions []string) (bool, error) { s.asked = append(s.asked, actions); return *answer, nil }
	}
	return o
}

// host is the fake's host, rooted in a directory of the test's whose
// /etc/passwd has agent-vm's account unless noAccount.
func (s *setupHost) host(t *testing.T, noAccount ...bool) hostpkgs.Host {
	h := hostpkgs.Host{Run: s.fake, Root: t.TempDir()}
	if len(noAccount) == 0 {
		os.MkdirAll(filepath.Join(h.Root, "etc"), 0o755)
		os.WriteFile(filepath.Join(h.Root, "etc", "passwd"), []byte(hostpkgs.Account+":x:59999:59999::/nonexistent:/usr/sbin/nologin\n"), 0o644)
	}
	return h
}

func TestSetupAsksOnceThenInstallsAndBuilds(t *testing.T) {
	s := newSetupHost(t)
	yes := true
	o := s.options(t, true, &yes)
	r, err := Setup(context.Background(), s.host(t), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.asked) != 1 || len(s.asked[0]) != 2 || !strings.Contains(s.asked[0][0], "qemu-system-x86") || !strings.Contains(s.asked[0][1], "base image") {
		t.Errorf("asked %q, want one question naming the packages and the image", s.asked)
	}
	if len(s.apt) != 2 || !strings.HasPrefix(s.apt[1], "install -y") || len(r.Installed) == 0 || s.builds != 1 || r.Image != "/images/disk.qcow2" {
		t.Errorf("apt calls %q, report %+v, builds %d", s.apt, r, s.builds)
	}
}

// As root, setup makes agent-vm's account (asking with the rest), as a
// user it has no use for one; the fake's useradd writes the entry.
func TestSetupMakesTheAccountAsRoot(t *testing.T) {
	s := newSetupHost(t)
	for _, p := range hostpkgs.All() {
		s.fake.Installed(p.Name, "/usr/sbin/"+p.Name)
	}
	h := s.host(t, true)
	var made []string
	s.fake.On("groupadd", func(c execxtest.Call) execxtest.Reply {
		made = append(made, "groupadd "+strings.Join(c.Args, " "))
		return execxtest.Reply{}
	})
	s.fake.On("useradd", func(c execxtest.Call) execxtest.Reply {
		made = append(made, "useradd "+strings.Join(c.Args, " "))
		os.MkdirAll(filepath.Join(h.Root, "etc"), 0o755)
		os.WriteFile(filepath.Join(h.Root, "etc", "passwd"), []byte(hostpkgs.Account+":x:59999:59999::/nonexistent:/usr/sbin/nologin\n"), 0o644)
		return execxtest.Reply{}
	})
	yes := true
	o := s.options(t, false, &yes)
	o.ImageDir = ""
	if r, err := Setup(context.Background(), h, o); err != nil || len(made) != 0 || len(s.asked) != 0 || len(r.Changed) != 0 {
		t.Fatalf("as a user: report %+v, err %v, ran %q, asked %q; want nothing", r, err, made, s.asked)
	}
	o.Root = true
	r, err := Setup(context.Background(), h, o)
	if err != nil || len(s.asked) != 1 || len(s.asked[0]) != 1 || !strings.Contains(s.asked[0][0], "system account agent-vm") {
		t.Fatalf("as root: err %v, asked %q; want one question about the account", err, s.asked)
	}
	if len(made) != 2 || !strings.Contains(made[0], "--gid 59999 agent-vm") || !strings.Contains(made[1], "--uid 59999 --gid 59999") ||
		len(r.Changed) != 1 || !strings.Contains(r.Changed[0], "account agent-vm (uid 59999)") {
		t.Errorf("ran %q, report %+v", made, r)
	}
	made, s.asked = nil, nil
	if _, err := Setup(context.Background(), h, o); err != nil || len(made) != 0 || len(s.asked) != 0 {
		t.Errorf("a second setup: err %v, ran %q, asked %q; want nothing to do", err, made, s.asked)
	}
}

func TestSetupWithoutConsentChangesNothing(t *testing.T) {
	no := false
	for name, answer := range map[string]*bool{"no terminal and no --yes": nil, "answered no": &no} {
		t.Run(name, func(t *testing.T) {
			s := newSetupHost(t)
			_, err := Setup(context.Background(), s.host(t), s.options(t, true, answer))
			if !errors.Is(err, ErrNoConsent) || !strings.Contains(err.Error(), "nothing was installed or built") || !strings.Contains(err.Error(), "--yes") {
				t.Errorf("err = %v", err)
			}
			if len(s.apt) != 0 || s.builds != 0 {
				t.Errorf("changed the host: apt %q, builds %d", s.apt, s.builds)
			}
		})
	}
}

func TestSetupNotRootPrintsTheSudoCommand(t *testing.T) {
	s := newSetupHost(t)
	yes := true
	_, err := Setup(context.Background(), s.host(t), s.options(t, false, &yes))
	if err == nil || !strings.Contains(err.Error(), "sudo apt-get update -q && sudo apt-get install -y -q --no-install-recommends") ||
		!strings.Contains(err.Error(), "sudo agent-vm image build") {
		t.Errorf("err = %v, want the exact sudo commands", err)
	}
	if len(s.apt) != 0 || len(s.asked) != 0 {
		t.Errorf("apt %q, asked %q: a non-root setup must neither ask nor install", s.apt, s.asked)
	}
}

func TestSetupOnASetUpHostDoesNothing(t *testing.T) {
	s := newSetupHost(t)
	for _, p := range hostpkgs.All() {
		s.fake.Installed(p.Name, "/usr/bin/"+p.Name)
	}
	yes := true
	o := s.options(t, true, &yes)
	o.ImageDir = "" // an image exists: nothing to build
	r, err := Setup(context.Background(), s.host(t), o)
	if err != nil || len(s.asked) != 0 || len(s.apt) != 0 || len(r.Installed) != 0 || r.Image != "" {
		t.Errorf("report %+v, err %v, asked %q, apt %q", r, err, s.asked, s.apt)
	}
}

func TestSetupOnNixOSPointsToTheFlake(t *testing.T) {
	s := newSetupHost(t)
	h := s.host(t)
	os.MkdirAll(filepath.Join(h.Root, "etc"), 0o755)
	os.WriteFile(filepath.Join(h.Root, "etc", "NIXOS"), nil, 0o644)
	yes := true
	r, err := Setup(context.Background(), h, s.options(t, true, &yes))
	if err != nil || len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "nix run .#agent-vm") || len(s.apt) != 0 || s.builds != 0 {
		t.Errorf("report %+v, err %v, apt %q, builds %d", r, err, s.apt, s.builds)
	}
}

func TestSetupReportsAFailedImageBuild(t *testing.T) {
	s := newSetupHost(t)
	yes := true
	o := s.options(t, true, &yes)
	o.Build = func(context.Context) (*image.Image, error) { return nil, errors.New("mmdebstrap failed") }
	if _, err := Setup(context.Background(), s.host(t), o); err == nil || !strings.Contains(err.Error(), "building the base image: mmdebstrap failed") {
		t.Errorf("err = %v", err)
	}
}

// start's set-up does not stop a user for a missing optional program
// (virtiofsd: the workspace goes over 9p), but installs it with the rest.
func TestSetupRequiredOnlyIgnoresOptionalPrograms(t *testing.T) {
	s := newSetupHost(t)
	for _, p := range hostpkgs.All() {
		if !p.Optional {
			s.fake.Installed(p.Name, "/usr/bin/"+p.Name)
		}
	}
	o := s.options(t, false, nil) // a user, no terminal
	o.ImageDir, o.RequiredOnly = "", true
	if _, err := Setup(context.Background(), s.host(t), o); err != nil || len(s.apt) != 0 {
		t.Errorf("err %v, apt %q: only virtiofsd is missing, which start does without", err, s.apt)
	}
	o.RequiredOnly = false
	if _, err := Setup(context.Background(), s.host(t), o); err == nil || !strings.Contains(err.Error(), "virtiofsd") {
		t.Errorf("setup itself must still want virtiofsd: err %v", err)
	}
}

// On a host without udev /dev/kvm is root's only; setup for the vagrant
// backend asks to, and does, let group kvm use it (a stand-in device under
// the host's Root); a user who is not root gets the command as a note.
func TestSetupLetsLibvirtUseKVM(t *testing.T) {
	s := newSetupHost(t)
	for _, p := range hostpkgs.All() {
		s.fake.Installed(p.Name, "/usr/bin/"+p.Name)
	}
	h := s.host(t)
	dev := filepath.Join(h.Root, "dev", "kvm")
	os.MkdirAll(filepath.Dir(dev), 0o755)
	os.MkdirAll(filepath.Join(h.Root, "etc"), 0o755)
	os.WriteFile(dev, nil, 0o600)
	os.WriteFile(filepath.Join(h.Root, "etc", "group"), []byte("kvm:x:"+strconv.Itoa(os.Getgid())+":\n"), 0o644)

	o := s.options(t, false, nil)
	o.ImageDir, o.Need = "", hostpkgs.Run|hostpkgs.Vagrant
	r, err := Setup(context.Background(), h, o)
	if err != nil || len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "chmod g+rw /dev/kvm") {
		t.Errorf("as a user: report %+v, err %v; want one note with the command", r, err)
	}
	if fi, _ := os.Stat(dev); fi.Mode().Perm() != 0o600 {
		t.Errorf("as a user setup changed /dev/kvm to %o", fi.Mode().Perm())
	}

	yes := true
	o = s.options(t, true, &yes)
	o.ImageDir, o.Need = "", hostpkgs.Run|hostpkgs.Vagrant
	if r, err = Setup(context.Background(), h, o); err != nil || len(r.Notes) != 0 || len(r.Changed) != 1 || !strings.Contains(r.Changed[0], "/dev/kvm") {
		t.Fatalf("as root: report %+v, err %v", r, err)
	}
	if len(s.asked) != 1 || len(s.asked[0]) != 1 || !strings.Contains(s.asked[0][0], "group kvm") {
		t.Errorf("asked %q, want one question about group kvm and /dev/kvm", s.asked)
	}
	if fi, _ := os.Stat(dev); fi.Mode().Perm() != 0o660 {
		t.Errorf("after setup /dev/kvm is %o, want 660", fi.Mode().Perm())
	}
	s.asked = nil
	if _, err = Setup(context.Background(), h, o); err != nil || len(s.asked) != 0 {
		t.Errorf("a second setup asked %q (err %v); want nothing to do", s.asked, err)
	}
}
