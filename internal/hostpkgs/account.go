package hostpkgs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// Account is the account of agent-vm's own that a VM's host processes
// run as when agent-vm runs as root: QEMU (-runas), the workspace share's
// virtiofsd and the egress proxy drop to it, and a workspace root owns is
// handed to it, so that what the guest can reach through a flaw in any of
// them is that account's (its VM's files), never root and never a
// person's account with its home and keys.
//
// It has no login shell, no home and no group but its own. Its uid is
// also the guest user's (the share keeps ownership: Debian 12's C
// virtiofsd maps no ids), and a guest gives the ids below 1000 to its own
// system accounts, so it is taken from the top of the range of ordinary
// accounts (AccountIDMax down), where it meets neither the guest's system
// accounts nor the host's people, whose ids are given from 1000 up.
const Account = "agent-vm"

// AccountIDMax and AccountIDMin bound the ids CreateAccount takes: the
// highest free one is taken. 1000 is where Debian's and Fedora's ordinary
// accounts begin; 59999 is below the ids Debian reserves for itself
// (60000-64999) and systemd's (from 60001).
const (
	AccountIDMax = 59999
	AccountIDMin = 1000
)

// AccountAction says what CreateAccount does, for setup's question.
const AccountAction = "make the system account " + Account + " (no login, no home) that QEMU, virtiofsd and the egress proxy run as"

// AccountIDs looks the account up in the host's /etc/passwd (under Root):
// its uid and gid, and ok false when the host has none.
func (h Host) AccountIDs() (uid, gid int, ok bool, err error) {
	var found bool
	var bad error
	if err := h.scanDB("passwd", func(f []string) bool {
		if f[0] != Account || len(f) < 4 {
			return false
		}
		var e1, e2 error
		uid, e1 = strconv.Atoi(f[2])
		gid, e2 = strconv.Atoi(f[3])
		if e1 != nil || e2 != nil {
			bad = fmt.Errorf("/etc/passwd: account %s has ids %q:%q (hint: mend the entry, or remove it with `userdel %s` and run `agent-vm setup`)", Account, f[2], f[3], Account)
		}
		found = true
		return true
	}); err != nil {
		return 0, 0, false, err
	}
	if bad != nil {
		return 0, 0, false, bad
	}
	if found && (uid == 0 || gid == 0) {
		return 0, 0, false, fmt.Errorf("the host's account %s is root's (uid %d, gid %d): agent-vm will not run VMs as root (hint: remove it, `userdel %s`, and run `agent-vm setup`)", Account, uid, gid, Account)
	}
	return uid, gid, found, nil
}

// CreateAccount makes the account (groupadd, useradd), with the highest
// id from AccountIDMax down that is neither a user's nor a group's, as uid
// and as its own group's gid, and returns them. A host that has it already
// keeps it as it is.
func (h Host) CreateAccount(ctx context.Context) (uid, gid int, err error) {
	if uid, gid, ok, err := h.AccountIDs(); err != nil || ok {
		return uid, gid, err
	}
	used := map[int]bool{}
	for _, db := range []string{"passwd", "group"} {
		if err := h.scanDB(db, func(f []string) bool {
			if len(f) >= 3 {
				if id, err := strconv.Atoi(f[2]); err == nil {
					used[id] = true
				}
			}
			return false
		}); err != nil {
			return 0, 0, err
		}
	}
	id := AccountIDMax
	for ; id >= AccountIDMin && used[id]; id-- {
	}
	if id < AccountIDMin {
		return 0, 0, fmt.Errorf("making the account %s: every id from %d to %d is taken (hint: make it yourself with an id of 1000 or more, `useradd --system --uid ID --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin %s`)", Account, AccountIDMin, AccountIDMax, Account)
	}
	// The group first, with the same id: useradd's --user-group would
	// take the group's from the system range, below 1000.
	n := strconv.Itoa(id)
	for _, c := range []execx.Cmd{
		{Path: "groupadd", Args: h.prefixed("--system", "--gid", n, Account)},
		{Path: "useradd", Args: h.prefixed("--system", "--uid", n, "--gid", n, "--no-create-home",
			"--home-dir", "/nonexistent", "--shell", nologin(h.root()), "--comment", "agent-vm's VMs", Account)},
	} {
		if prog, err := Lookup(c.Path); err == nil {
			if path, ok := h.Find(prog); ok {
				c.Path = path
			}
		}
		if _, err := h.Run.Run(ctx, c); err != nil {
			// Another agent-vm may have made it meanwhile (two first
			// creates at once): then it is there to use.
			if uid, gid, ok, lerr := h.AccountIDs(); lerr == nil && ok {
				return uid, gid, nil
			}
			return 0, 0, fmt.Errorf("making the account %s that VMs run as: %w (hint: run `agent-vm setup` as root)", Account, err)
		}
	}
	uid, gid, ok, err := h.AccountIDs()
	if err == nil && !ok {
		err = fmt.Errorf("useradd made no account %s in %s", Account, filepath.Join(h.root(), "etc", "passwd"))
	}
	return uid, gid, err
}

// prefixed puts useradd's and groupadd's --prefix before args when the
// host is rooted elsewhere (tests).
func (h Host) prefixed(args ...string) []string {
	if h.Root == "" {
		return args
	}
	return append([]string{"--prefix", h.Root}, args...)
}

// nologin is the shell of an account nobody logs in as.
func nologin(root string) string {
	for _, p := range []string{"/usr/sbin/nologin", "/sbin/nologin"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			return p
		}
	}
	return "/bin/false"
}

// scanDB calls line with each entry's fields of the host's /etc/<db>
// (passwd, group) under Root, until it returns true. A missing file has
// no entries.
func (h Host) scanDB(db string, line func(fields []string) bool) error {
	f, err := os.Open(filepath.Join(h.root(), "etc", db))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Split(sc.Text(), ":"); len(fields) >= 3 && line(fields) {
			return nil
		}
	}
	return sc.Err()
}
