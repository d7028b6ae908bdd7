package vm

import (
	"context"
	"fmt"
	"strings"

	"github.com/agent-vm/agent-vm/internal/sshconfig"
	"github.com/agent-vm/agent-vm/internal/state"
)

// SSHConfigFor is `ssh-config [BRANCH]`: the Host block of the VM name
// means, or of every VM when name is "".
func (m *Manager) SSHConfigFor(ctx context.Context, name string) (string, error) {
	all, err := []state.Entry{{}}, error(nil)
	if name == "" {
		all, err = m.List(ctx)
	} else {
		all[0], err = m.Recorded(ctx, name)
	}
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, e := range all {
		var block string
		if _, foreign := m.Foreign(e.Record); !foreign {
			block = sshconfig.Blocks([]state.Entry{e})
		} else if block, err = m.foreignSSHConfig(ctx, e); err != nil && name != "" {
			return "", err
		} else if err != nil {
			block = fmt.Sprintf("# %s: skipped, %s\n\n", e.Slug, sshconfig.Comment(err.Error()))
		}
		b.WriteString(block)
	}
	return b.String(), nil
}
