package vm

import (
	"context"
	"maps"
	"slices"

	"github.com/agent-vm/agent-vm/internal/hostsetup"
)

// Doctor checks the host (hostsetup.Doctor) with this build's drivers and
// backends, the default backend first, and the templates' line.
func (m *Manager) Doctor(ctx context.Context) hostsetup.DoctorReport {
	in := hostsetup.DoctorInput{Run: m.Run, Accel: m.Accel(ctx), ImageDir: m.ImageDir(), Extra: []hostsetup.Check{m.templateCheck(ctx)}, Pins: m.PinFile}
	for _, name := range slices.Sorted(maps.Keys(m.Drivers)) {
		in.Drivers = append(in.Drivers, m.Drivers[name])
	}
	if def, err := m.resolveBackend(BackendAuto); err == nil {
		in.Default = def.Name()
	}
	for _, name := range m.backendNames(in.Default) {
		in.Backends = append(in.Backends, m.Backends[name])
	}
	return hostsetup.Doctor(ctx, in)
}

// backendNames are the backends this build has: first the default one,
// then the others sorted.
func (m *Manager) backendNames(first string) []string {
	names := make([]string, 0, len(m.Backends))
	for n := range m.Backends {
		if n != first {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	if _, ok := m.Backends[first]; ok {
		names = append([]string{first}, names...)
	}
	return names
}
