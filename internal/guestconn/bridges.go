package guestconn

import (
	"context"
	"net"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hold"
)

// reverseForwards are the holder's reverse forwards: the browser bridges the VM's
// browser.json (bridge.Config, in its run directory) says are open, each with its
// host end.
func (g Guest) reverseForwards(log hclog.Logger, notices *hold.Notices) ([]hold.ReverseForward, error) {
	d, err := bridge.ReadConfig(g.Layout.RunDir())
	if err != nil {
		return nil, err
	}
	var out []hold.ReverseForward
	if dir := d.ChromeBridge; dir != "" {
		out = append(out, hold.ReverseForward{Name: "Claude in Chrome bridge", GuestSocket: guest.ChromeBridgeSocket,
			Prepare: bridge.PrepareSocket(guest.ChromeBridgeSocket),
			Serve:   bridge.Tunnel("unix", func() (string, error) { return bridge.FindChromeBridge(dir) }, log)})
	}
	if d.DevTools != "" {
		relay := &bridge.CDPRelay{Addr: d.DevTools, VM: g.Record.Slug, LogPath: d.Log, Log: log.Named("devtools")}
		out = append(out, hold.ReverseForward{Name: "DevTools", GuestPort: guest.DevToolsPort, Serve: relay.Serve})
	}
	if d.OpenURLs {
		opener := &bridge.URLOpener{VM: g.Record.Slug, Open: true, Run: execx.OS{}, OpenerPath: d.Opener, LogPath: d.Log,
			Notify: func(line string) { log.Info(line); notices.Send(line) }}
		out = append(out, hold.ReverseForward{Name: "URL", GuestSocket: guest.OpenURLSocket, Prepare: bridge.PrepareSocket(guest.OpenURLSocket),
			Serve: func(ctx context.Context, c net.Conn) {
				if err := opener.Serve(ctx, c); err != nil {
					log.Warn("the URL opener", "error", err)
				}
			}})
	}
	return out, nil
}

// ReloadBridges has the VM's holder open the bridges its browser.json names
// and close the others. Reverse forwards live in the holder: without one, this
// fails with hold.ErrNoHolder.
func (g Guest) ReloadBridges(ctx context.Context) error {
	return hold.Reload(ctx, g.Files(), g.Record.Guest.User)
}
