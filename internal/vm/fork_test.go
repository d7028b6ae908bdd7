package vm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/fork"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/qemu/qemutest"
	"github.com/agent-vm/agent-vm/internal/seed"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// A fork's tests run the real fork over real VM directories: real git
// workspaces, real qcow2 disks (qemu-img, qemu-io), the real state
// directory; a running source is the labelled fake QEMU (qemutest), which
// answers QMP's stop and cont. Nothing boots here but in forkStartsAsItself,
// which TestTemplate runs on its real VM: a fork's first start boots its
// copy of the disk as the source and makes the guest the fork's
// (internal/debian's ForkDisk).

func forks(m *vm.Manager) fork.Forks {
	return fork.Forks{VMs: m, Root: m.Root, Git: m.Git, Log: m.Log, Now: time.Now}
}

// forkWork is the workspace's state a fork must carry: a commit the source
// repository lacks, a change not committed, an untracked and an ignored
// file.
func forkWork(t *testing.T, ws string) (head string) {
	t.Helper()
	tu.WriteFile(t, filepath.Join(ws, "done.txt"), "committed in the VM\n")
	tu.Git(t, ws, "add", "done.txt")
	tu.Git(t, ws, "commit", "--quiet", "-m", "agent work")
	tu.WriteFile(t, filepath.Join(ws, "README.md"), "changed, not committed\n")
	tu.WriteFile(t, filepath.Join(ws, "notes.txt"), "untracked\n")
	tu.WriteFile(t, filepath.Join(ws, ".git", "info", "exclude"), "build/\n")
	tu.WriteFile(t, filepath.Join(ws, "build", "out.bin"), "ignored\n")
	return tu.Git(t, ws, "rev-parse", "HEAD")
}

// workedVM is a stopped VM of m on branch whose agent has worked
// (forkWork: its HEAD head) and that has a root disk (forkDisk, on base).
type workedVM struct {
	e              state.Entry
	ws, head, base string
}

func newWorkedVM(t *testing.T, m *vm.Manager, branch string) workedVM {
	t.Helper()
	_, ws := stoppedVM(t, m, branch)
	w := workedVM{ws: ws, head: forkWork(t, ws)}
	var err error
	if w.e, err = m.Find(context.Background(), branch); err != nil {
		t.Fatal(err)
	}
	w.base = forkDisk(t, w.e.Layout)
	return w
}

// forkDisk gives the VM in l a root disk as the qemu backend makes one: a
// qcow2 overlay on a base (here a small qcow2 of the test's own) and its
// disk.json, with a pattern written in it.
func forkDisk(t *testing.T, l state.Layout) (base string) {
	t.Helper()
	tu.Program(t, "qemu-img")
	tu.Program(t, "qemu-io")
	base = filepath.Join(t.TempDir(), "base.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	disk := filepath.Join(l.Dir, debian.DiskFile)
	if err := image.CreateOverlay(context.Background(), execx.OS{}, base, "qcow2", disk, 0); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 4M", disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	info, _ := json.Marshal(debian.DiskInfo{Base: base, BaseFormat: "qcow2"})
	tu.WriteFile(t, filepath.Join(l.Dir, debian.DiskInfoFile), string(info))
	// A VM whose disk has booted has its keys, which a fork of it keeps for
	// its first start.
	for _, d := range []string{l.SSHDir(), l.SecretsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(l.ClientKey()); err == nil {
		return base // a second disk for the VM
	}
	if err := state.WriteSecrets(l, &state.Record{Slug: filepath.Base(l.Dir)}); err != nil {
		t.Fatal(err)
	}
	return base
}

// sameDisk fails the test unless the two disks read the same.
func sameDisk(t *testing.T, a, b string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", "compare", "-f", "qcow2", "-F", "qcow2", a, b).CombinedOutput(); err != nil {
		t.Errorf("%s and %s differ: %v\n%s", a, b, err, out)
	}
}

// nothingStaged fails the test when a fork left a directory being made.
func nothingStaged(t *testing.T, m *vm.Manager) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(m.Root.Dir, ".tmp", "*"))
	if len(left) > 0 {
		t.Errorf("left in the staging directory: %q", left)
	}
}

// A stopped VM forks into two: each a VM of its own on its new branch at
// the source's HEAD, with the workspace as it was (the uncommitted change,
// the untracked and the ignored file), the source's disk's content in a
// file of its own, new keys, token and ports, the source's policy. sync
// brings a fork's commits home; destroying the source, then a fork, leaves
// the other whole.
func TestForkAStoppedVM(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	src, ws := stoppedVM(t, m, "feat")
	e, err := m.Find(ctx, "feat")
	if err != nil {
		t.Fatal(err)
	}
	head := forkWork(t, ws)
	forkDisk(t, e.Layout)
	srcCA, _, err := egress.CAFiles(e.Layout.ProxyCA(), e.Layout.ProxyCAKey(), e.Slug)
	if err != nil {
		t.Fatal(err)
	}
	e.Record.Net = &state.Net{Mode: "allow", Allow: []string{"example.com"}}
	if err := state.WriteRecord(e.Layout.Record(), e.Record); err != nil {
		t.Fatal(err)
	}

	res, err := forks(m).Fork(ctx, "feat", []string{"try/a", "try/b"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Source != "feat" || res.State != driver.StateStopped || res.Paused != 0 || len(res.Forks) != 2 {
		t.Fatalf("result %+v", res)
	}
	ports := map[int]string{e.Record.Ports.SSH: "feat", e.Record.Ports.MCP: "feat"}
	for i, b := range []string{"try/a", "try/b"} {
		made := res.Forks[i]
		f, err := m.Find(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		r, l := f.Record, f.Layout
		if made.Branch != b || made.Slug != r.Slug || made.Commit != head || made.Files == 0 || made.DiskBytes == 0 {
			t.Errorf("%s: made %+v", b, made)
		}
		if r.ID == e.Record.ID || r.Backend != debian.Name || r.Git != e.Record.Git || r.Net == nil || r.Net.Allow[0] != "example.com" {
			t.Errorf("%s: record %+v", b, r)
		}
		if s, err := state.SectionOf[debian.Settings](r); err != nil || s.Adopt != seed.InstanceID(e.Record, 0) || s.Forked {
			t.Errorf("%s: settings %+v (%v); want it to boot as the source's instance %s at its first start", b, s, err, seed.InstanceID(e.Record, 0))
		}
		// The keys that first start logs in with: the source's, the
		// private one readable by the user alone.
		kept := state.Layout{Dir: filepath.Join(l.Dir, debian.AdoptDir)}
		for mine, theirs := range map[string]string{kept.ClientKey(): e.Layout.ClientKey(), kept.HostPubKey(): e.Layout.HostPubKey()} {
			got, err := os.ReadFile(mine)
			want, _ := os.ReadFile(theirs)
			if fi, serr := os.Stat(mine); err != nil || serr != nil || !bytes.Equal(got, want) || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: %s is not a copy of the source's %s readable by the user alone (%v)", b, mine, theirs, err)
			}
		}
		// The source's egress CA, which the copy of its disk trusts.
		if ca, err := os.ReadFile(l.ProxyCA()); !m.Contains(r) || err != nil || !bytes.Equal(ca, srcCA) {
			t.Errorf("%s: its egress CA is not the source's (contained %v): %v", b, m.Contains(r), err)
		}
		for _, p := range []int{r.Ports.SSH, r.Ports.MCP} {
			if other, taken := ports[p]; taken {
				t.Errorf("%s has port %d, which %s has", b, p, other)
			}
			ports[p] = b
		}
		for _, file := range []func(state.Layout) string{state.Layout.ClientKey, state.Layout.HostKey, state.Layout.MCPToken} {
			mine, _ := os.ReadFile(file(l))
			theirs, _ := os.ReadFile(file(e.Layout))
			if len(mine) == 0 || bytes.Equal(mine, theirs) {
				t.Errorf("%s: %s is empty or the source's", b, file(l))
			}
		}
		fws := l.Workspace()
		if got := tu.Git(t, fws, "branch", "--show-current"); got != b {
			t.Errorf("%s: the workspace is on %q", b, got)
		}
		if got := tu.Git(t, fws, "rev-parse", "HEAD"); got != head {
			t.Errorf("%s: HEAD %s, want the source's %s", b, got, head)
		}
		for name, want := range map[string]string{"README.md": "changed, not committed\n", "notes.txt": "untracked\n", "build/out.bin": "ignored\n"} {
			if got, err := os.ReadFile(filepath.Join(fws, name)); string(got) != want {
				t.Errorf("%s: %s is %q (%v), want %q", b, name, got, err, want)
			}
		}
		if st := tu.Git(t, fws, "status", "--porcelain"); !strings.Contains(st, "M README.md") || !strings.Contains(st, "?? notes.txt") {
			t.Errorf("%s: git status\n%s\nwant README.md changed and notes.txt untracked", b, st)
		}
		sameDisk(t, filepath.Join(e.Layout.Dir, debian.DiskFile), filepath.Join(l.Dir, debian.DiskFile))
	}
	nothingStaged(t, m)

	// A fork of a fork that has not started yet: its disk is still the
	// source's guest, so it keeps the source's instance and keys.
	if _, err := forks(m).Fork(ctx, "try/b", []string{"try/c"}); err != nil {
		t.Fatal(err)
	}
	c, err := m.Find(ctx, "try/c")
	if err != nil {
		t.Fatal(err)
	}
	if s, err := state.SectionOf[debian.Settings](c.Record); err != nil || s.Adopt != seed.InstanceID(e.Record, 0) {
		t.Errorf("try/c: settings %+v (%v); want the first source's instance %s", s, err, seed.InstanceID(e.Record, 0))
	}
	got, _ := os.ReadFile(state.Layout{Dir: filepath.Join(c.Layout.Dir, debian.AdoptDir)}.ClientKey())
	if want, _ := os.ReadFile(e.Layout.ClientKey()); len(got) == 0 || !bytes.Equal(got, want) {
		t.Error("try/c does not keep the first source's client key")
	}

	s, err := m.Sync(ctx, "try/a")
	if err != nil {
		t.Fatal(err)
	}
	if s.Ref != "refs/remotes/agent-vm/try/a" || s.New != head {
		t.Errorf("sync of the fork: %+v, want %s at %s", *s, "refs/remotes/agent-vm/try/a", head)
	}
	if tu.Git(t, src, "rev-parse", "refs/remotes/agent-vm/try/a") != head {
		t.Error("the fork's commit is not in the source repository after sync")
	}

	// Each is whole without the other.
	if _, err := m.Destroy(ctx, "feat", true); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Destroy(ctx, "try/b", true); err != nil {
		t.Fatal(err)
	}
	a, err := m.Find(ctx, "try/a")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-img", "check", "-q", filepath.Join(a.Layout.Dir, debian.DiskFile)).CombinedOutput(); err != nil {
		t.Errorf("try/a's disk after the others went: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(a.Layout.Workspace(), "notes.txt")); string(got) != "untracked\n" {
		t.Errorf("try/a's workspace after the others went: notes.txt %q", got)
	}
}

// A running source is paused for the copy and continued after; its guest
// is asked to sync first (the fake has no sshd, so the result says the copy
// may miss its last writes). Labelled fake: QEMU is qemutest's, which
// answers QMP.
func TestForkARunningVMPausesItForTheCopy(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	writeFirst := stopWrites(t, m, "feat")
	fake := runningClone(t, m, "feat")
	forkWork(t, fake.Entry.Layout.Workspace())
	forkDisk(t, fake.Entry.Layout)
	writeFirst()

	res, err := forks(m).Fork(ctx, "feat", []string{"try"})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != driver.StateRunning || res.Paused <= 0 || res.Unsynced == "" || len(res.Forks) != 1 {
		t.Errorf("result %+v: want the running source paused for a while, and why its guest did not sync", res)
	}
	_, _, live, err := m.Inspect(ctx, fake.Entry)
	if err != nil || live.State != driver.StateRunning {
		t.Errorf("the source after the fork: %+v, %v; want it running again", live, err)
	}
	if _, err := os.Stat(filepath.Join(fake.Entry.Layout.RunDir(), qemu.PauseFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pause mark is left: %v", err)
	}
	f, err := m.Find(ctx, "try")
	if err != nil {
		t.Fatal(err)
	}
	sameDisk(t, filepath.Join(fake.Entry.Layout.Dir, debian.DiskFile), filepath.Join(f.Layout.Dir, debian.DiskFile))
	lastWritten(t, f.Layout.Workspace())
}

// lastWrite is a file of the workspace that the fake QEMU (labelled) is
// told to write as it is paused (qemutest.StopWriteEnv, set before it
// starts), after the copy's first pass copied the file's older content
// of the same size (stopWrites).
const lastWrite = "last-write"

// stopWrites sets the fake QEMU of VM slug, started after it, to write
// lastWrite in its workspace as it is paused; writeFirst, called once the
// workspace is there, writes the older content.
func stopWrites(t *testing.T, m *vm.Manager, slug string) (writeFirst func()) {
	p := filepath.Join(m.Root.Layout(slug).Workspace(), lastWrite)
	t.Setenv(qemutest.StopWriteEnv, p)
	return func() { tu.WriteFile(t, p, strings.ToUpper(qemutest.StopWriteContent)) }
}

// lastWritten checks that the workspace's copy at dest has what the guest
// wrote as the pause began.
func lastWritten(t *testing.T, dest string) {
	t.Helper()
	if got, err := os.ReadFile(filepath.Join(dest, lastWrite)); err != nil || string(got) != qemutest.StopWriteContent {
		t.Errorf("the copy's %s: %q, %v; want what the guest wrote as the pause began, %q", lastWrite, got, err, qemutest.StopWriteContent)
	}
}

// runningClone starts the fake QEMU (qemutest, labelled) for a VM of branch
// whose workspace is a real clone of a new repository.
func runningClone(t *testing.T, m *vm.Manager, branch string) fakeVM {
	t.Helper()
	ctx := context.Background()
	src := tu.Repo(t, true)
	id, err := m.Git.RepoID(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	return startFakeVMWith(t, m, branch, state.Git{Source: src, Repo: id}, func(ws string) {
		if _, err := m.Git.Clone(ctx, gitws.CloneOptions{Source: src, Dest: ws, Branch: branch}); err != nil {
			t.Fatal(err)
		}
	}, false)
}

// What fork refuses, each before anything is made and with the reason.
func TestForkRefuses(t *testing.T) {
	m := debianManager(t)
	m.Backends[nixos.Name] = &nixos.Backend{Run: execx.OS{}, Log: m.Log}
	ctx := context.Background()
	src, _ := stoppedVM(t, m, "feat")
	feat, err := m.Find(ctx, "feat")
	if err != nil {
		t.Fatal(err)
	}
	vmDir(t, m, "other", feat.Record.Git, func(ws string) { os.Mkdir(ws, 0o755) }) // the same repository's
	_, nl := vmDir(t, m, "nix", state.Git{Source: src}, func(ws string) { os.Mkdir(ws, 0o755) })
	setBackend(t, nl, nixos.Name, "")
	_, pl := vmDir(t, m, "placed", state.Git{Source: src}, func(ws string) { os.Mkdir(ws, 0o755) })
	setBackend(t, pl, debian.Name, "far")
	tu.Git(t, src, "branch", "taken")
	before, _ := m.List(ctx)

	for _, tc := range []struct {
		name, src string
		branches  []string
		want      string
	}{
		{"no new branch", "feat", nil, "no branch to fork into"},
		{"into itself", "feat", []string{"feat"}, "into itself"},
		{"a branch twice", "feat", []string{"a", "a"}, "given twice"},
		{"an invalid name", "feat", []string{"bad..name"}, "bad..name"},
		{"a branch the repository has", "feat", []string{"taken"}, `has a branch "taken" already`},
		{"a branch with a VM", "feat", []string{"x", "other"}, "already exists"},
		{"no such VM", "nothing-here", []string{"x"}, "nothing-here"},
		{"a backend that cannot fork", "nix", []string{"x"}, "cannot fork yet"},
		{"a VM on another host", "placed", []string{"x"}, "placed on host far"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := forks(m).Fork(ctx, tc.src, tc.branches)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if after, _ := m.List(ctx); len(after) != len(before) {
				t.Errorf("%d VMs after the refusal, %d before", len(after), len(before))
			}
			nothingStaged(t, m)
		})
	}
}

// setBackend rewrites the record in l with backend and host.
func setBackend(t *testing.T, l state.Layout, backend, host string) {
	t.Helper()
	r, err := state.ReadRecord(l.Record())
	if err != nil {
		t.Fatal(err)
	}
	r.Backend, r.Host = backend, host
	if err := state.WriteRecord(l.Record(), r); err != nil {
		t.Fatal(err)
	}
}

// A fork that fails part way (the disk's base pruned; the disk full, on a
// small tmpfs under the staging directory) leaves nothing of any fork,
// and the source as it was.
func TestForkLeavesNothingWhenItFails(t *testing.T) {
	t.Run("the base image is gone", func(t *testing.T) {
		m := debianManager(t)
		ctx := context.Background()
		w := newWorkedVM(t, m, "feat")
		os.Remove(w.base)
		_, err := forks(m).Fork(ctx, "feat", []string{"a", "b"})
		if err == nil || !strings.Contains(err.Error(), "is gone") {
			t.Fatalf("got %v, want the base named as gone", err)
		}
		noForks(t, m, "a", "b")
	})
	t.Run("the disk fills", func(t *testing.T) {
		tu.Need(t, os.Geteuid() == 0, "mounts a tmpfs: needs root")
		m := debianManager(t)
		ctx := context.Background()
		newWorkedVM(t, m, "feat")
		smallStaging(t, m)
		_, err := forks(m).Fork(ctx, "feat", []string{"a"})
		if err == nil || !strings.Contains(err.Error(), "no space left") {
			t.Fatalf("got %v, want the full disk named", err)
		}
		noForks(t, m, "a")
	})
}

// smallStaging mounts a tmpfs of 2 MiB where forks are staged: room for
// forkWork's workspace, not for forkDisk's 4 MiB.
func smallStaging(t *testing.T, m *vm.Manager) {
	t.Helper()
	staging := filepath.Join(m.Root.Dir, ".tmp")
	os.MkdirAll(staging, 0o700)
	if err := syscall.Mount("tmpfs", staging, "tmpfs", 0, "size=2m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(staging, syscall.MNT_DETACH) })
}

// A running source whose fork fills the disk runs on: when the
// workspace's first copy fills it, before the source is paused at all;
// when the disk's copy does, in the pause, after which it is continued.
// Labelled fake: QEMU is qemutest's, which logs the QMP commands it gets.
func TestForkOfARunningVMThatFillsTheDisk(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "mounts a tmpfs: needs root")
	for _, c := range []struct {
		name      string
		workspace int // bytes of an extra file in the workspace
		paused    bool
	}{
		{"before the pause", 3 << 20, false},
		{"in the pause", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := debianManager(t)
			ctx := context.Background()
			fake := runningClone(t, m, "feat")
			forkWork(t, fake.Entry.Layout.Workspace())
			forkDisk(t, fake.Entry.Layout)
			if c.workspace > 0 {
				tu.WriteFile(t, filepath.Join(fake.Entry.Layout.Workspace(), "big.bin"), strings.Repeat("x", c.workspace))
			}
			smallStaging(t, m) // big.bin does not fit
			_, err := forks(m).Fork(ctx, "feat", []string{"a"})
			if err == nil || !strings.Contains(err.Error(), "no space left") {
				t.Fatalf("got %v, want the full disk named", err)
			}
			noForks(t, m, "a")
			if _, _, live, err := m.Inspect(ctx, fake.Entry); err != nil || live.State != driver.StateRunning {
				t.Errorf("the source after the failed fork: %+v, %v; want it running", live, err)
			}
			log, _ := os.ReadFile(fake.Entry.Layout.Log(qemu.QEMULog))
			stopped, continued := strings.Contains(string(log), "qmp: stop"), strings.Contains(string(log), "qmp: cont")
			if stopped != c.paused || continued != c.paused {
				t.Errorf("QMP stop %v, cont %v; want both %v:\n%s", stopped, continued, c.paused, log)
			}
		})
	}
}

// noForks fails the test if a VM of any of branches exists, or anything
// is left being made.
func noForks(t *testing.T, m *vm.Manager, branches ...string) {
	t.Helper()
	for _, b := range branches {
		if _, err := m.Find(context.Background(), b); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("%s: %v, want no VM", b, err)
		}
	}
	nothingStaged(t, m)
}

// Two forks of one VM at once: the second waits for the first (the source's
// lock), and both are made, each whole.
func TestTwoForksOfOneVMAtOnce(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	w := newWorkedVM(t, m, "feat")
	e := w.e
	errs := make(chan error, 2)
	for _, b := range []string{"one", "two"} {
		go func() {
			_, err := forks(m).Fork(ctx, "feat", []string{b})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for _, b := range []string{"one", "two"} {
		f, err := m.Find(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		sameDisk(t, filepath.Join(e.Layout.Dir, debian.DiskFile), filepath.Join(f.Layout.Dir, debian.DiskFile))
	}
	nothingStaged(t, m)
}

// forkStartsAsItself forks the running VM e (booted from its own disk, its
// workspace written to by the test before) and starts the fork: its first
// boot is the source's disk booted as the source, which the start makes
// the fork's over SSH with the source's keys, with no provisioning. The
// source runs on; tmpl-b is stopped first, so that two VMs run.
func forkStartsAsItself(t *testing.T, m *vm.Manager, e state.Entry, logs *tu.SyncBuffer) {
	ctx := context.Background()
	src := e.Record.Branch
	sh := guestSh(t, m, src)
	sh("echo made-in-the-source > ~/on-the-disk")
	srcMachineID := sh("cat /etc/machine-id")
	const branch, failing = "tmpl-a-fork", "tmpl-a-fork-2"
	if _, err := forks(m).Fork(ctx, src, []string{branch, failing}); err != nil {
		t.Fatal(err)
	}
	f, err := m.Find(ctx, branch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serial console of %s:\n%s", branch, driver.TailFile(f.Layout.Log(qemu.ConsoleLog), 40))
		}
		m.Destroy(context.Background(), branch, true)
		m.Destroy(context.Background(), failing, true)
	})
	if _, err := m.Stop(ctx, "tmpl-b"); err != nil {
		t.Fatal(err)
	}

	// A first start that cannot log in as the source (a 1 s --timeout)
	// says what its next start does, and keeps neither the mark nor the
	// source's keys: that start's seed names the fork's own instance, so
	// the guest provisions itself as the fork.
	_, err = m.Start(ctx, failing, vm.StartOptions{Timeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "waiting for SSH as the VM it was made from") || !strings.Contains(err.Error(), "its next start, after a stop, provisions the copied disk as this VM") {
		t.Errorf("%s's first start with a 1 s timeout: %v; want it to fail logging in as the source, saying what follows", failing, err)
	}
	ff, _ := m.Find(ctx, failing)
	if pid := m.Status(ctx, ff, false).Pid; pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL) // no guest to shut down yet
	}
	if s, err := state.SectionOf[debian.Settings](ff.Record); err != nil || s.Adopt != "" {
		t.Errorf("%s after its failed first start: settings %+v (%v), want no adoption left", failing, s, err)
	}
	if _, err := os.Stat(filepath.Join(ff.Layout.Dir, debian.AdoptDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s keeps the source's keys after its failed first start: %v", failing, err)
	}

	res := start(t, m, branch)
	if res.FromTemplate || res.HealthReady == 0 {
		t.Errorf("the fork's start: %+v, want a boot of its own disk with agent-mcp healthy", res)
	}
	if !strings.Contains(logs.String(), "ssh answers as the VM it was made from") {
		t.Error("the fork's start did not log in as the source: its guest was provisioned anew, or took its identity some other way")
	}
	fsh := guestSh(t, m, branch)
	pub, _ := os.ReadFile(f.Layout.HostPubKey())
	token, _ := os.ReadFile(f.Layout.MCPToken())
	got := fsh("cat ~/on-the-disk; hostname; cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub; cat /var/lib/cloud/data/instance-id; " +
		"cat /var/lib/agent-vm/reprovision-tried 2>/dev/null; cat /workspace/from-host; git -C /workspace branch --show-current; sudo -n cat /run/agent-vm/mcp-token")
	want := strings.Join([]string{"made-in-the-source", f.Slug, strings.Fields(string(pub))[1], seed.InstanceID(f.Record, 0), src, branch, strings.TrimSpace(string(token))}, "\n")
	if got != want {
		t.Errorf("the fork's guest (the source's file on its disk; its hostname, host key, instance-id; no re-provisioning; the workspace's copy and branch; its MCP token):\n%s\nwant\n%s", got, want)
	}
	if id := fsh("cat /etc/machine-id"); id == srcMachineID {
		t.Errorf("the fork has the source's machine-id %s", id)
	}
	// The source's client key does not log in to the fork, and the fork
	// keeps no copy of it.
	target := sshx.Target{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(f.Record.Ports.SSH)), User: f.Record.Guest.User,
		KeyFile: e.Layout.ClientKey(), KnownHosts: f.Layout.KnownHosts()}
	if c, err := sshx.Dial(ctx, target, 20*time.Second); err == nil {
		c.Close()
		t.Error("the source's client key logs in to the fork")
	} else if !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("the source's key on the fork: got %v, want an authentication failure", err)
	}
	if _, err := os.Stat(filepath.Join(f.Layout.Dir, debian.AdoptDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the fork keeps the source's keys after its first start: %v", err)
	}
}
