package qemu

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/qmp"
)

// netdev is the id of the user-mode netdev this boot makes: the one Start
// records (Launch.Netdev) for AddForward and RemoveForward.
func (b Boot) netdev() string {
	if b.Script != nil {
		return b.Script.Netdev
	}
	return DirectNetdev
}

// AddForward forwards 127.0.0.1:f.Host to f.Guest in the running VM, on the
// netdev its start recorded, through QMP's human-monitor-command
// `hostfwd_add` (QMP has no command of its own for it). The forward lasts
// until QEMU exits.
func (l *Launcher) AddForward(ctx context.Context, m Machine, f driver.Forward) error {
	out, err := l.monitor(ctx, m, "hostfwd_add", hostfwd(f))
	if err != nil {
		return err
	}
	// hostfwd_add says nothing when it worked; it reports its failures as
	// text ("Could not set up host forwarding rule 'tcp:...'"), not as
	// QMP errors.
	switch {
	case out == "":
		return nil
	case strings.Contains(out, "Could not set up host forwarding rule"):
		return fmt.Errorf("port %d is already in use on 127.0.0.1 by another program (hint: stop that program, or choose another host port; `ss -ltnp 'sport = :%d'` shows it): %w", f.Host, f.Host, ports.ErrTaken)
	}
	return fmt.Errorf("forwarding host port %d to guest port %d: QEMU says: %s", f.Host, f.Guest, out)
}

// RemoveForward ends the forward of host port f.Host in the running VM
// (`hostfwd_remove`); one that is not there is no error.
func (l *Launcher) RemoveForward(ctx context.Context, m Machine, f driver.Forward) error {
	out, err := l.monitor(ctx, m, "hostfwd_remove", "tcp:127.0.0.1:"+strconv.Itoa(f.Host))
	if err != nil {
		return err
	}
	if strings.Contains(out, " removed") || strings.Contains(out, " not found") {
		return nil
	}
	return fmt.Errorf("removing the forward of host port %d: QEMU says: %s", f.Host, out)
}

// monitor runs a human monitor command on the running VM's user-mode
// netdev and returns its output, trimmed.
func (l *Launcher) monitor(ctx context.Context, m Machine, cmd, arg string) (string, error) {
	live, err := l.Inspect(ctx, m)
	if err != nil {
		return "", err
	}
	if !live.Alive() && !live.InPlace() { // a paused QEMU's network runs on
		return "", fmt.Errorf("%s is %s: %w", m.Name, live.State, driver.ErrNotRunning)
	}
	if live.Launch == nil || live.Launch.Netdev == "" {
		return "", fmt.Errorf("%s was started by an agent-vm that did not record its network device, so its forwards cannot change while it runs (hint: restart the VM)", m.Name)
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := qmp.Dial(qctx, m.QMPPath())
	if err != nil {
		return "", fmt.Errorf("reaching %s's QEMU over QMP: %w (hint: another agent-vm command may be using it; try again)", m.Name, err)
	}
	defer c.Close()
	line := cmd + " " + live.Launch.Netdev + " " + arg
	res, err := c.Execute(qctx, "human-monitor-command", map[string]string{"command-line": line})
	if err != nil {
		return "", fmt.Errorf("%s: %w", line, err)
	}
	return strings.TrimSpace(res.String()), nil
}
