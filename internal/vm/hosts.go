package vm

import (
	"context"
	"errors"

	"github.com/agent-vm/agent-vm/internal/hosts"
)

// HostDoctor runs `host doctor` on the registered host called name,
// through the Manager's runner.
func (m *Manager) HostDoctor(ctx context.Context, name string) (hosts.Report, error) {
	if m.Hosts == nil {
		return hosts.Report{}, errors.New("internal error: no hosts registry")
	}
	h, err := m.Hosts.Get(name)
	if err != nil {
		return hosts.Report{}, err
	}
	return (&hosts.Doctor{Run: m.Run}).Check(ctx, h), nil
}
