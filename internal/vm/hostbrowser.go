package vm

import (
	"context"

	"github.com/agent-vm/agent-vm/internal/hostbrowser"
)

// LaunchBrowser starts agent-vm's own Chromium with its DevTools endpoint
// on the host's 127.0.0.1:port and its profile in agent-vm's browser
// directory (hostdir's Browser), or finds the one running (`browser
// --launch`).
func (m *Manager) LaunchBrowser(ctx context.Context, port int) (hostbrowser.Launched, error) {
	return hostbrowser.Launch(ctx, hostbrowser.Options{Run: m.Run, Dir: m.dirs.Browser, Port: port})
}
