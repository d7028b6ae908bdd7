package gitws

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Ownership decides the guest user's uid/gid from the owner of the
// workspace ws on the host, so files the agent creates belong to that
// owner. A root-owned workspace is handed to the account rootOwner gives
// (the guest user cannot be root; agent-vm's own account, never a
// person's: hostpkgs.Account), asked for only then.
func Ownership(ws string, rootOwner func() (uid, gid int, err error)) (uid, gid int, err error) {
	fi, err := os.Stat(ws)
	if err != nil {
		return 0, 0, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	uid, gid = int(st.Uid), int(st.Gid)
	if uid != 0 {
		return uid, gid, nil
	}
	if uid, gid, err = rootOwner(); err != nil {
		return 0, 0, err
	}
	err = filepath.WalkDir(ws, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("handing the workspace to the guest user (uid %d): %w", uid, err)
	}
	return uid, gid, nil
}
