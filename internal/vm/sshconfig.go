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
	if name == "" {
		all, err := m.List(ctx)
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, e := range all {
			if _, foreign := m.Foreign(e.Record); !foreign {
				b.WriteString(sshconfig.Blocks([]state.Entry{e}))
				continue
			}
			block, err := m.foreignSSHConfig(ctx, e)
			if err != nil {
				block = fmt.Sprintf("# %s: skipped, %s\n\n", e.Slug, sshconfig.Comment(err.Error()))
			}
			b.WriteString(block)
		}
		return b.String(), nil
	}
	e, err := m.Recorded(ctx, name)
	if err != nil {
		return "", err
	}
	if _, foreign := m.Foreign(e.Record); foreign {
		return m.foreignSSHConfig(ctx, e)
	}
	return sshconfig.Blocks([]state.Entry{e}), nil
}
