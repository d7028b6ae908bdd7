package vagrant

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// The forwarders here are real: OpenSSH's ssh run with vagrant-libvirt's
// own options (forward_ports.rb, redirect_port) against a real sshd
// (sshdtest) standing for the guest, its pid and output where
// vagrant-libvirt keeps them.

// forwardRig is a machine with one forward, host port Host, to the test
// sshd's own port.
func forwardRig(t *testing.T) (*Driver, driver.Machine, *sshdtest.Server) {
	tu.Program(t, "ssh")
	srv := sshdtest.New(t)
	srv.Start()
	dir := t.TempDir()
	m := driver.Machine{Name: "agent-vm-fw", UUID: "0123abcd-2222", RunDir: filepath.Join(dir, "run"), LogsDir: filepath.Join(dir, "logs"),
		Forwards: []driver.Forward{{Name: "ssh", Host: tu.FreePort(t), Guest: srv.Port}}}
	d := &Driver{Log: hclog.NewNullLogger()}
	return d, m, srv
}

// spawnForwarder starts port's forwarder as vagrant-libvirt does and
// returns a channel closed when it exited (and was reaped).
func spawnForwarder(t *testing.T, m driver.Machine, srv *sshdtest.Server, f driver.Forward) <-chan struct{} {
	t.Helper()
	data := machineData(m)
	for _, sub := range []string{"pids", "logs"} {
		if err := os.MkdirAll(filepath.Join(data, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	log, err := os.Create(filepath.Join(data, "logs", fmt.Sprintf("ssh-forwarding-127.0.0.1_%d-127.0.0.1_%d.log", f.Host, f.Guest)))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	var args []string
	for _, o := range []string{"User=" + srv.User, fmt.Sprint("Port=", srv.Port), "UserKnownHostsFile=/dev/null", "ExitOnForwardFailure=yes",
		"ControlMaster=no", "StrictHostKeyChecking=no", "PasswordAuthentication=no", "ForwardX11=no", "IdentitiesOnly=yes", "IdentityFile=" + srv.KeyFile} {
		args = append(args, "-o", o)
	}
	args = append(args, "-n", "-L", fmt.Sprintf("127.0.0.1:%d:127.0.0.1:%d", f.Host, f.Guest), "-N", "127.0.0.1")
	cmd := exec.Command("ssh", args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	if err := os.WriteFile(forwarderPidFile(m, f.Host), []byte(fmt.Sprint(cmd.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	return done
}

func TestVerifyForwardsSeesVagrantsForwarder(t *testing.T) {
	d, m, srv := forwardRig(t)
	f := m.Forwards[0]
	fw := spawnForwarder(t, m, srv, f)
	if err := d.VerifyForwards(context.Background(), m, "`agent-vm start fw` again"); err != nil {
		t.Fatal(err)
	}
	// What listens is the forward to the "guest": its sshd answers.
	c, err := net.DialTimeout("tcp", fmt.Sprint("127.0.0.1:", f.Host), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	banner := make([]byte, 8)
	n, _ := c.Read(banner)
	c.Close()
	if !strings.HasPrefix(string(banner[:n]), "SSH-2.0") {
		t.Errorf("the forwarded port answered %q; want the sshd's banner", banner[:n])
	}

	// A start after a crash: the forwarder the last run left is ended, and
	// the port is free for the next.
	if err := d.checkPortsFree(m); err != nil {
		t.Fatalf("with a forwarder of its own left: %v", err)
	}
	select {
	case <-fw:
	case <-time.After(10 * time.Second):
		t.Errorf("the forwarder the last run left still runs")
	}
	if _, err := os.Stat(forwarderPidFile(m, f.Host)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("its pid file is left: %v", err)
	}
}

func TestVerifyForwardsPortHeldByAnother(t *testing.T) {
	d, m, srv := forwardRig(t)
	f := m.Forwards[0]
	// Another program (this test) holds the port, as another VM's forward
	// did in a real run.
	ln, err := net.Listen("tcp", fmt.Sprint("127.0.0.1:", f.Host))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := d.checkPortsFree(m); !errors.Is(err, ports.ErrTaken) || !strings.Contains(err.Error(), fmt.Sprint(f.Host)) {
		t.Errorf("checkPortsFree with the port held: %v; want ErrTaken naming the port", err)
	}
	spawnForwarder(t, m, srv, f)
	err = d.VerifyForwards(context.Background(), m, "`agent-vm start fw` again")
	if !errors.Is(err, ports.ErrTaken) {
		t.Fatalf("VerifyForwards with the port held: %v; want ErrTaken", err)
	}
	for _, want := range []string{fmt.Sprintf("host port %d, the ssh port of fw, is held by another program", f.Host), "ss -ltnp 'sport = :", "`agent-vm start fw` again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestVerifyForwardsWithoutForwarder(t *testing.T) {
	d, m, _ := forwardRig(t)
	err := d.VerifyForwards(context.Background(), m, "`agent-vm start fw` again")
	if err == nil || !strings.Contains(err.Error(), "vagrant recorded no forwarder") || errors.Is(err, ports.ErrTaken) {
		t.Errorf("VerifyForwards with no forwarder: %v", err)
	}
}
