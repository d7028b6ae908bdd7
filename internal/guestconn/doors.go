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

// doors are the holder's doors: the browser doors the VM's doors file
// (bridge.Doors, in its run directory) says are open, each with its host
// end.
func (g Guest) doors(log hclog.Logger, notices *hold.Notices) ([]hold.Door, error) {
	d, err := bridge.ReadDoors(g.Layout.RunDir())
	if err != nil {
		return nil, err
	}
	var out []hold.Door
	if dir := d.ChromeBridge; dir != "" {
		out = append(out, hold.Door{Name: "Claude in Chrome bridge", GuestSocket: guest.ChromeBridgeSocket,
			Prepare: bridge.PrepareSocket(guest.ChromeBridgeSocket),
			Serve:   bridge.Tunnel("unix", func() (string, error) { return bridge.FindChromeBridge(dir) }, log)})
	}
	if d.DevTools != "" {
		relay := &bridge.CDPRelay{Addr: d.DevTools, VM: g.Record.Slug, LogPath: d.Log, Log: log.Named("devtools")}
		out = append(out, hold.Door{Name: "DevTools", GuestPort: guest.DevToolsPort, Serve: relay.Serve})
	}
	if d.OpenURLs {
		door := &bridge.URLDoor{VM: g.Record.Slug, Open: true, Run: execx.OS{}, OpenerPath: d.Opener, LogPath: d.Log,
			Notify: func(line string) { log.Info(line); notices.Send(line) }}
		out = append(out, hold.Door{Name: "URL", GuestSocket: guest.OpenURLSocket, Prepare: bridge.PrepareSocket(guest.OpenURLSocket),
			Serve: func(ctx context.Context, c net.Conn) {
				if err := door.Serve(ctx, c); err != nil {
					log.Warn("the URL door", "error", err)
				}
			}})
	}
	return out, nil
}

// ReloadDoors has the VM's holder open the doors its doors file names
// and close the others. Doors live in the holder: without one, this
// fails with hold.ErrNoHolder.
func (g Guest) ReloadDoors(ctx context.Context) error {
	return hold.Reload(ctx, g.Files(), g.Record.Guest.User)
}
