package gitws

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// A workspace a user owns keeps that user, and the account is not asked
// for; a root-owned one, files and links in it included, is handed to the
// account rootOwner gives; rootOwner's failure is Ownership's, with
// nothing handed over.
func TestOwnership(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "handing a workspace over needs root (chown)")
	ws := t.TempDir()
	os.MkdirAll(filepath.Join(ws, "d"), 0o755)
	os.WriteFile(filepath.Join(ws, "d", "f"), []byte("x"), 0o644)
	os.Symlink("d/f", filepath.Join(ws, "link"))
	owner := func(p string) [2]uint32 {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return [2]uint32{st.Uid, st.Gid}
	}

	refused := errors.New("no account")
	if _, _, err := Ownership(ws, func() (int, int, error) { return 0, 0, refused }); !errors.Is(err, refused) {
		t.Fatalf("a failing account: %v", err)
	}
	if got := owner(filepath.Join(ws, "d", "f")); got != [2]uint32{0, 0} {
		t.Errorf("after the failure, a file is %v's", got)
	}
	asked := 0
	account := func() (int, int, error) { asked++; return 59997, 59996, nil }
	uid, gid, err := Ownership(ws, account)
	if err != nil || uid != 59997 || gid != 59996 || asked != 1 {
		t.Fatalf("root's workspace: %d:%d, %v (asked %d); want the account's 59997:59996", uid, gid, err, asked)
	}
	for _, p := range []string{ws, filepath.Join(ws, "d"), filepath.Join(ws, "d", "f"), filepath.Join(ws, "link")} {
		if got := owner(p); got != [2]uint32{59997, 59996} {
			t.Errorf("%s is %v's, want the account's", p, got)
		}
	}
	// Now the account's: it stays so, nobody asked.
	uid, gid, err = Ownership(ws, account)
	if err != nil || uid != 59997 || gid != 59996 || asked != 1 {
		t.Errorf("the account's workspace: %d:%d, %v (asked %d more)", uid, gid, err, asked-1)
	}
}
