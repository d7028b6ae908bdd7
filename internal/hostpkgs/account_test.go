package hostpkgs_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// accountRoot is a host root for the real useradd and groupadd (their
// --prefix): a copy of this host's account files and login.defs, plus
// the entries given, appended to passwd and group.
func accountRoot(t *testing.T, passwd, group string) string {
	t.Helper()
	tu.Need(t, os.Geteuid() == 0, "useradd and groupadd need root, even under --prefix")
	tu.Program(t, "useradd")
	tu.Program(t, "groupadd")
	root := t.TempDir()
	etc := filepath.Join(root, "etc")
	for _, d := range []string{etc, filepath.Join(root, "usr", "sbin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr", "sbin", "nologin"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	add := map[string]string{"passwd": passwd, "group": group}
	for _, name := range []string{"passwd", "group", "shadow", "gshadow", "login.defs"} {
		b, err := os.ReadFile(filepath.Join("/etc", name))
		if err != nil {
			t.Fatal(err)
		}
		// This host's own agent-vm account, made by an earlier run, is
		// not the test's.
		var keep []string
		for _, l := range strings.SplitAfter(string(b), "\n") {
			if !strings.HasPrefix(l, hostpkgs.Account+":") {
				keep = append(keep, l)
			}
		}
		if err := os.WriteFile(filepath.Join(etc, name), []byte(strings.Join(keep, "")+add[name]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func entry(t *testing.T, root, db string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc", db))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, hostpkgs.Account+":") {
			return l
		}
	}
	return ""
}

// The account is made with the real useradd and groupadd, at the highest
// id that is neither a user's nor a group's, the same for its group; with
// no login shell and no home. Made once: a second call changes nothing.
func TestCreateAccount(t *testing.T) {
	root := accountRoot(t, "taken:x:59999:100::/home/taken:/bin/sh\n", "alsotaken:x:59998:\n")
	h := hostpkgs.Host{Run: execx.OS{}, Root: root}
	if _, _, ok, err := h.AccountIDs(); ok || err != nil {
		t.Fatalf("before: AccountIDs ok %v, %v; want no account", ok, err)
	}
	uid, gid, err := h.CreateAccount(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if uid != 59997 || gid != 59997 {
		t.Errorf("ids %d:%d, want 59997:59997 (59999 is a user's, 59998 a group's)", uid, gid)
	}
	if got, want := entry(t, root, "passwd"), "agent-vm:x:59997:59997:agent-vm's VMs:/nonexistent:/usr/sbin/nologin"; got != want {
		t.Errorf("passwd entry %q, want %q", got, want)
	}
	if got, want := entry(t, root, "group"), "agent-vm:x:59997:"; got != want {
		t.Errorf("group entry %q, want %q (a group of its own, no members)", got, want)
	}
	if got := entry(t, root, "shadow"); !strings.HasPrefix(got, "agent-vm:!") {
		t.Errorf("shadow entry %q: want a locked password", got)
	}
	if _, err := os.Stat(filepath.Join(root, "nonexistent")); err == nil {
		t.Errorf("a home was made")
	}
	before := entry(t, root, "passwd")
	uid2, gid2, err := h.CreateAccount(context.Background())
	if err != nil || uid2 != uid || gid2 != gid || entry(t, root, "passwd") != before {
		t.Errorf("second CreateAccount: %d:%d, %v; want the same account, unchanged", uid2, gid2, err)
	}
}

// A group called agent-vm without the account (left by hand): groupadd's
// refusal comes back with what to do, and no account is half made.
func TestCreateAccountGroupTaken(t *testing.T) {
	root := accountRoot(t, "", hostpkgs.Account+":x:4242:\n")
	h := hostpkgs.Host{Run: execx.OS{}, Root: root}
	_, _, err := h.CreateAccount(context.Background())
	if err == nil || !strings.Contains(err.Error(), "making the account agent-vm") || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("err %v; want groupadd's refusal, named", err)
	}
	if got := entry(t, root, "passwd"); got != "" {
		t.Errorf("passwd has %q after the failure", got)
	}
}

// An account of that name with root's ids is refused: VMs never run as root.
func TestAccountIsNotRoot(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("agent-vm:x:0:0::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, ok, err := hostpkgs.Host{Root: root}.AccountIDs()
	if ok || err == nil || !strings.Contains(err.Error(), "userdel agent-vm") {
		t.Fatalf("ok %v, err %v; want a refusal with the fix", ok, err)
	}
}
