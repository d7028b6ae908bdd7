package egress

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// An entry written by root (the URL opener's holder) into a directory of
// another user's leaves the file that user's, also after a rotation, so
// the VM's proxy, running as that user, still writes to it.
func TestLogWrittenAsRootKeepsTheDirectorysOwner(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "only root writes files another user owns")
	dir := filepath.Join(t.TempDir(), "net")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	l := &Log{Dir: root, Name: LogFile, Limit: 200}
	owner := func() uint32 {
		fi, err := os.Stat(filepath.Join(dir, LogFile))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Uid
	}
	for i := range 3 { // the second or third write rotates (Limit)
		if err := l.Add(LogEntry{Time: time.Now(), Kind: KindOpenURL, Host: "example.test", Port: 443, Allowed: true, Rule: "opened"}); err != nil {
			t.Fatal(err)
		}
		if uid := owner(); uid != 65534 {
			t.Fatalf("after write %d the log is uid %d's, want the directory owner's (65534)", i+1, uid)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, LogFile+".1")); err != nil {
		t.Fatalf("no rotation happened, so the test proved less than it says: %v", err)
	}
}
