package vm

import (
	"context"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/hostbrowser"
)

// LaunchBrowser starts agent-vm's own Chromium with its DevTools endpoint
// on the host's 127.0.0.1:port and its profile in agent-vm's browser
// directory (hostdir's Browser), or finds the one running (`browser
// --launch`).
func (m *Manager) LaunchBrowser(ctx context.Context, port int) (hostbrowser.Launched, error) {
	return hostbrowser.Launch(ctx, hostbrowser.Options{Run: m.Run, Dir: m.Dirs.Browser, Port: port})
}

// StopBrowser stops agent-vm's Chromium unless a VM of this state
// directory other than except has a browser bridge to it open (then it names that
// VM and stops nothing).
func (m *Manager) StopBrowser(ctx context.Context, except string) (usedBy string, stopped bool, err error) {
	entries, err := m.Root.List()
	if err != nil {
		return "", false, err
	}
	for _, e := range entries {
		if e.Slug == except || e.Record == nil {
			continue
		}
		if d, err := bridge.ReadConfig(e.Layout.RunDir()); err == nil && d.Launched {
			return e.Slug, false, nil
		}
	}
	stopped, err = hostbrowser.Stop(ctx, hostbrowser.Options{Run: m.Run, Dir: m.Dirs.Browser})
	return "", stopped, err
}
