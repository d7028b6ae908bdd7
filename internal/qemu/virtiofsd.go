package qemu

import (
	"context"
	"time"

	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// startVirtiofsd starts virtiofsd for the machine's share (package
// virtiofsd; jailed as root, with the launcher's Geteuid and Self) and
// waits for its socket. On failure the process is gone and the error says
// why.
func (l *Launcher) startVirtiofsd(ctx context.Context, v *virtiofsd.Binary, m Machine) (int, error) {
	s := virtiofsd.Spec{Share: m.Share, Socket: m.sockFile(VirtiofsdSock), Log: m.logFile(VirtiofsdLog)}
	return virtiofsd.Start(ctx, l.Run, v, s, virtiofsd.Options{Geteuid: l.Geteuid, Self: l.Self})
}

// stopVirtiofsd ends this VM's virtiofsd (virtiofsd.Stop).
func (l *Launcher) stopVirtiofsd(m Machine, pid int, wait time.Duration) {
	virtiofsd.Stop(pid, m.sockFile(VirtiofsdSock), wait)
}

// stopStrayVirtiofsds ends every virtiofsd still serving this VM's socket
// once its QEMU is gone (virtiofsd.StopStrays).
func (l *Launcher) stopStrayVirtiofsds(m Machine) {
	virtiofsd.StopStrays(m.sockFile(VirtiofsdSock))
}

// backoff yields growing delays up to a cap.
type backoff struct{ cur, max time.Duration }

func newBackoff(start, max time.Duration) *backoff { return &backoff{cur: start, max: max} }

func (b *backoff) next() time.Duration {
	d := b.cur
	if b.cur *= 2; b.cur > b.max {
		b.cur = b.max
	}
	return d
}
