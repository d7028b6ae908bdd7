package browser

import (
	"context"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostbrowser"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Host is agent-vm's own Chromium on the host (`browser --launch`), which
// the VMs' DevTools bridges may share.
type Host struct {
	Run execx.Runner
	// Dir holds its profile (hostdir's Browser).
	Dir *hostdir.Dir
	// Entries lists the VMs whose bridges may use it (a state directory's).
	Entries func() ([]state.Entry, error)
}

// Launch starts it with its DevTools endpoint on the host's
// 127.0.0.1:port, or finds it running (Options.Launcher).
func (h Host) Launch(ctx context.Context, port int) (hostbrowser.Launched, error) {
	return hostbrowser.Launch(ctx, hostbrowser.Options{Run: h.Run, Dir: h.Dir, Port: port})
}

// Stop stops it unless a VM other than except has a bridge to it open:
// then it names that VM and stops nothing (a Stopper).
func (h Host) Stop(ctx context.Context, except string) (usedBy string, stopped bool, err error) {
	entries, err := h.Entries()
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
	stopped, err = hostbrowser.Stop(ctx, hostbrowser.Options{Run: h.Run, Dir: h.Dir})
	return "", stopped, err
}
