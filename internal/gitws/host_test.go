package gitws

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/hostlink/hostlinktest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestMain removes the agent-vm binary the tests built (git's ssh to the
// host), once they are done.
func TestMain(m *testing.M) {
	code := m.Run()
	tu.RemoveAgentVMBinary()
	os.Exit(code)
}

// testHost is this machine reached as a remote host: through the link to
// its real sshd, git's ssh the shim of agent-vm's binary.
func testHost(t *testing.T) Host {
	t.Helper()
	srv, c := hostlinktest.Dial(t)
	target := hostlink.Target{Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts}
	return Host{Name: "test", Run: hostlink.Runner{C: c}, SSH: hostlink.ExecArgv(tu.AgentVMBinary(t), target)}
}

// hostDest is where a workspace goes on the host: under a directory of
// the test's own, in a VM directory that is there.
func hostDest(t *testing.T) string {
	t.Helper()
	vmDir := filepath.Join(t.TempDir(), "vm")
	if err := os.Mkdir(vmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(vmDir, "workspace")
}

// cloneShape is what a clone's config and refs say, sorted.
func cloneShape(t *testing.T, ws string) string {
	t.Helper()
	conf := strings.Split(tu.Git(t, ws, "config", "--local", "--list"), "\n")
	sort.Strings(conf)
	refs := tu.Git(t, ws, "for-each-ref", "--format=%(refname) %(objectname) %(symref)")
	return strings.Join(conf, "\n") + "\n--\n" + refs + "\n--\nHEAD " + tu.Git(t, ws, "symbolic-ref", "HEAD") + " " + tu.Git(t, ws, "rev-parse", "HEAD")
}

// ownedBy fails the test for each file under dir not owned by uid:gid.
func ownedBy(t *testing.T, dir string, uid, gid uint32) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || st.Gid != gid {
			t.Errorf("%s is owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The clone on the host is the clone Clone makes locally (config, refs,
// the branch checked out with its files), each of its files the guest's.
func TestCloneOnHostIsClonesClone(t *testing.T) {
	h := testHost(t)
	src := tu.Repo(t, true)
	tu.Git(t, src, "tag", "-a", "-m", "first", "v1")
	tu.Git(t, src, "checkout", "--quiet", "-b", "feature/x")
	commit(t, src, "f.txt", "on feature")
	tu.Git(t, src, "checkout", "--quiet", "main")
	commit(t, src, "later.txt", "later on main")
	for _, o := range []CloneOptions{
		{Source: src, Branch: "feature/x"},
		{Source: src, Branch: "new", From: "v1"},
		{Source: src, Branch: "from-head"},
	} {
		t.Run(o.Branch, func(t *testing.T) {
			local := filepath.Join(t.TempDir(), "workspace")
			o.Dest = local
			want, err := New(execx.OS{}).Clone(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			o.Dest = hostDest(t)
			got, err := New(execx.OS{}).CloneOnHost(context.Background(), h, HostCloneOptions{CloneOptions: o, UID: 65534, GID: 65533})
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("remotes: got %+v, want %+v", got, want)
			}
			// First: git status (and cloneShape's) rewrites the index.
			ownedBy(t, o.Dest, 65534, 65533)
			if g, w := cloneShape(t, o.Dest), cloneShape(t, local); g != w {
				t.Errorf("the clone on the host:\n%s\nwant, as Clone makes it:\n%s", g, w)
			}
			if s := tu.Git(t, o.Dest, "status", "--porcelain"); s != "" {
				t.Errorf("the checkout is not clean: %q", s)
			}
			if o.Branch == "feature/x" {
				if _, err := os.Stat(filepath.Join(o.Dest, "f.txt")); err != nil {
					t.Errorf("the branch's file is missing: %v", err)
				}
			}
			if b, _ := filepath.Glob(filepath.Join(o.Dest, ".git", "*bundle*")); len(b) > 0 {
				t.Errorf("left on the host: %v", b)
			}
		})
	}
}

// failingRunner runs every program but one, which fails without running:
// a step that breaks halfway through the clone.
type failingRunner struct {
	execx.Runner
	fail string
}

func (r failingRunner) Run(ctx context.Context, c execx.Cmd) (execx.Result, error) {
	if c.Path == r.fail {
		return execx.Result{ExitCode: 1}, &execx.Error{Cmd: c.String(), ExitCode: 1, Err: errors.New("exit status 1"), Stderr: "refused by the test"}
	}
	return r.Runner.Run(ctx, c)
}

// A refused or failed clone names what was wrong with a hint, and leaves
// nothing on the host (a directory that was there stays as it was).
func TestCloneOnHostRefusals(t *testing.T) {
	h := testHost(t)
	src := tu.Repo(t, false)
	cases := []struct {
		name  string
		setup func(t *testing.T, o *HostCloneOptions, h *Host)
		want  []string
	}{
		{"the directory is there", func(t *testing.T, o *HostCloneOptions, h *Host) {
			tu.WriteFile(t, filepath.Join(o.Dest, "mine.txt"), "not agent-vm's\n")
		}, []string{"is there already", "(hint: "}},
		{"its parent is not", func(t *testing.T, o *HostCloneOptions, h *Host) {
			o.Dest = filepath.Join(t.TempDir(), "no-vm", "workspace")
		}, []string{"no-vm", "is not there", "(hint: "}},
		{"--from is not a commit", func(t *testing.T, o *HostCloneOptions, h *Host) {
			o.Branch, o.From = "new", "no-such-ref"
		}, []string{`--from "no-such-ref"`, "(hint: "}},
		{"the chown fails", func(t *testing.T, o *HostCloneOptions, h *Host) {
			h.Run = failingRunner{Runner: h.Run, fail: "chown"}
		}, []string{"handing it to 1000:1000", "refused by the test"}},
		{"git on the host fails", func(t *testing.T, o *HostCloneOptions, h *Host) {
			h.Run = failingRunner{Runner: h.Run, fail: "git"}
		}, []string{"git init", "refused by the test"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := HostCloneOptions{CloneOptions: CloneOptions{Source: src, Dest: hostDest(t), Branch: "main"}, UID: 1000, GID: 1000}
			hc := h
			c.setup(t, &o, &hc)
			before := listing(t, filepath.Dir(o.Dest))
			_, err := New(execx.OS{}).CloneOnHost(context.Background(), hc, o)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if after := listing(t, filepath.Dir(o.Dest)); after != before {
				t.Errorf("the host's directory changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// listing is every path under dir ("" when dir is not there).
func listing(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "\n")
}

func syncFromHost(t *testing.T, h Host, ws, src, branch string) *SyncResult {
	t.Helper()
	res, err := New(execx.OS{}).SyncFromHost(context.Background(), h, ws, src, branch)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A commit made in the workspace on the host comes into the source as
// Sync brings one from a local workspace, through git's ssh (the shim) and
// the host's upload-pack; a rewritten branch is forced.
func TestSyncFromHost(t *testing.T) {
	h := testHost(t)
	src := tu.Repo(t, true)
	ws := hostDest(t)
	o := HostCloneOptions{CloneOptions: CloneOptions{Source: src, Dest: ws, Branch: "feature/x"}, UID: 65534, GID: 65534}
	if _, err := New(execx.OS{}).CloneOnHost(context.Background(), h, o); err != nil {
		t.Fatal(err)
	}
	commit(t, ws, "a.txt", "agent one")
	tip := tu.Git(t, ws, "rev-parse", "HEAD")
	want := SyncResult{Branch: "feature/x", Ref: SyncRefs + "feature/x", New: tip, Commits: 1}
	if res := syncFromHost(t, h, ws, src, "feature/x"); !reflect.DeepEqual(*res, want) {
		t.Errorf("first sync: got %+v, want %+v", *res, want)
	}
	if got := tu.Git(t, src, "tag", "--list"); got != "" {
		t.Errorf("tags were fetched: %q", got)
	}
	tu.Git(t, ws, "commit", "--quiet", "--amend", "-m", "agent one, amended")
	amended := tu.Git(t, ws, "rev-parse", "HEAD")
	want = SyncResult{Branch: "feature/x", Ref: want.Ref, Old: tip, New: amended, Commits: 1, Forced: true}
	if res := syncFromHost(t, h, ws, src, "feature/x"); !reflect.DeepEqual(*res, want) {
		t.Errorf("after an amend: got %+v, want %+v", *res, want)
	}
	if res := syncFromHost(t, h, ws, src, "feature/x"); res.Old != amended || res.New != amended || res.Commits != 0 || res.Forced {
		t.Errorf("again: got %+v, want up to date at %s", *res, amended)
	}
}

// The workspace on the host is the agent's: a sync from it runs nothing
// of it there (nor anything its path says, passed through the host's
// shell), whatever its config, hooks and attributes.
func TestSyncFromHostRunsNothingOfTheWorkspace(t *testing.T) {
	h := testHost(t)
	src, ws, markers := hostileWorkspace(t)
	tip := tu.Git(t, ws, "rev-parse", "HEAD")
	res := syncFromHost(t, h, ws, src, "feat")
	if res.New != tip || res.Commits != 2 {
		t.Errorf("got %+v, want the agent's 2 commits up to %s", *res, tip)
	}
	ran, _ := os.ReadDir(markers)
	for _, m := range ran {
		t.Errorf("syncing ran the workspace's %s", m.Name())
	}
	home, _ := os.UserHomeDir()
	for _, dir := range []string{src, ws, filepath.Dir(ws), home, "/"} {
		if _, err := os.Stat(filepath.Join(dir, "pwned-by-the-path")); err == nil {
			t.Errorf("the workspace's path was run as a command (found in %s)", dir)
		}
	}
}

func TestSyncFromHostRefusals(t *testing.T) {
	h := testHost(t)
	cases := []struct {
		name  string
		setup func(t *testing.T, ws string) (dir, branch string)
		want  []string
	}{
		{"the branch renamed", func(t *testing.T, ws string) (string, string) {
			tu.Git(t, ws, "branch", "-m", "feature/x", "renamed\u202e")
			return ws, "feature/x"
		}, []string{`the workspace ` + "%WS" + ` on host test has no branch "feature/x"`, `renamed\u202e`, "git branch -m OTHER feature/x"}},
		{"a .git file pointing elsewhere", func(t *testing.T, ws string) (string, string) {
			dir := t.TempDir()
			tu.WriteFile(t, filepath.Join(dir, ".git"), "gitdir: "+filepath.Join(ws, ".git")+"\n")
			return dir, "feature/x"
		}, []string{"has no .git directory of its own"}},
		{"no workspace", func(t *testing.T, ws string) (string, string) {
			return filepath.Join(ws, "gone"), "feature/x"
		}, []string{"is not there", "(hint: "}},
		{"an invalid branch name", func(t *testing.T, ws string) (string, string) { return ws, "a..b" },
			[]string{`invalid branch name "a..b"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := tu.Repo(t, false)
			ws := hostDest(t)
			o := HostCloneOptions{CloneOptions: CloneOptions{Source: src, Dest: ws, Branch: "feature/x"}}
			if _, err := New(execx.OS{}).CloneOnHost(context.Background(), h, o); err != nil {
				t.Fatal(err)
			}
			dir, branch := c.setup(t, ws)
			_, err := New(execx.OS{}).SyncFromHost(context.Background(), h, dir, src, branch)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if w = strings.ReplaceAll(w, "%WS", dir); !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if got := syncedRefs(t, src); got != "" {
				t.Errorf("a refused sync wrote refs: %s", got)
			}
		})
	}
}
