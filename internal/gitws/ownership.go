package gitws

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Ownership decides the guest user's uid/gid from the owner of the
// workspace ws on the host, so files the agent creates belong to that
// owner. A root-owned workspace is handed to rootOwner instead (the guest
// user cannot be root: guest.RootOwnerID).
func Ownership(ws string, rootOwner int) (uid, gid int, err error) {
	fi, err := os.Stat(ws)
	if err != nil {
		return 0, 0, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	uid, gid = int(st.Uid), int(st.Gid)
	if uid != 0 {
		return uid, gid, nil
	}
	err = filepath.WalkDir(ws, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, rootOwner, rootOwner)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("handing the workspace to the guest user (uid %d): %w", rootOwner, err)
	}
	return rootOwner, rootOwner, nil
}
