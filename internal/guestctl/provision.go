package guestctl

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"
)

// ProvisionError is a boot whose run of the repository's provisioning
// (guest.ProvisionScript, the packages) failed. The VM is left running.
type ProvisionError struct {
	VM   string // the branch
	Slug string
	Exit int
	Tail string // the last lines of the guest's provisioning log
}

func (e *ProvisionError) Error() string {
	return fmt.Sprintf("%s: the repository's provisioning failed on its first boot (exit status %d)\nlast lines of %s in the guest:\n%s\n"+
		"(hint: the VM is running: `agent-vm logs %s` shows the whole log, `agent-vm shell %s` lets you look around; fix %s or the packages (.agent-vm/config.toml, create --packages), then `agent-vm reset --force %s` and `agent-vm start %s` provision a fresh disk)",
		e.VM, e.Exit, guest.ProvisionLog, termsafe.Indent(e.Tail), e.Slug, e.Slug, guest.ProvisionScript, e.Slug, e.Slug)
}

// provisionCheck prints the provisioning status file, the current boot id
// and, after a failure, the log's tail. Run as the guest user.
var provisionCheck = fmt.Sprintf(`cat %[1]s 2>/dev/null; echo "current=$(cat /proc/sys/kernel/random/boot_id)"; `+
	`if grep -qx status=failed %[1]s 2>/dev/null; then echo ---; tail -n 20 %[2]s 2>/dev/null; fi`,
	guest.ProvisionStatus, guest.ProvisionLog)

// CheckProvision asks the guest of branch (VM slug) over c how its
// provisioning went. A failure on this boot is a ProvisionError; one on an
// earlier boot (the VM was used since) is a warning on log; a guest that
// has not provisioned (an older VM, a check that cannot run) is nothing.
func CheckProvision(ctx context.Context, c *ssh.Client, branch, slug string, log hclog.Logger) error {
	var out, errOut strings.Builder
	if _, err := sshx.Run(ctx, c, provisionCheck, nil, &out, &errOut); err != nil {
		log.Warn("could not ask the guest how its provisioning went", "error", err)
		return nil
	}
	st := parseProvisionStatus(out.String())
	if st.status != "failed" {
		return nil
	}
	if st.boot != st.current {
		log.Warn("the repository's provisioning failed on an earlier boot", "exit", st.exit,
			"hint", fmt.Sprintf("`agent-vm logs %s` shows its log; `agent-vm reset --force %s` provisions a fresh disk", slug, slug))
		return nil
	}
	return &ProvisionError{VM: branch, Slug: slug, Exit: st.exit, Tail: st.tail}
}

type provisionStatus struct {
	status, boot, current, tail string
	exit                        int
}

// parseProvisionStatus reads provisionCheck's output.
func parseProvisionStatus(s string) provisionStatus {
	var st provisionStatus
	head, tail, _ := strings.Cut(s, "---\n")
	st.tail = strings.TrimRight(tail, "\n")
	for _, line := range strings.Split(head, "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "status":
			st.status = v
		case "exit":
			st.exit, _ = strconv.Atoi(v)
		case "boot":
			st.boot = v
		case "current":
			st.current = v
		}
	}
	return st
}
