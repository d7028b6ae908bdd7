package selfcmd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// net-forward's refusals are usage errors (exit 2) naming what is wrong,
// before anything listens (a partial set of --via flags names the ones
// missing); a port another program holds, and a link whose key cannot be
// read, are errors naming them.
func TestNetForwardRefusals(t *testing.T) {
	st := t.TempDir()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	hp := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "net-forward needs at least one --forward PORT=HOST:PORT or --return-socket SOCKET=PORT"},
		{[]string{"--return-socket", "rel/sock=8080"}, 2, `--return-socket "rel/sock=8080" is not SOCKET=PORT`},
		{[]string{"--return-socket", "/run/x/8080=0"}, 2, `--return-socket "/run/x/8080=0" is not SOCKET=PORT`},
		{[]string{"--return-socket", "/run/x/8080=8080"}, 2, "--return-socket needs the --via flags"},
		{[]string{"--forward", "2222"}, 2, `forward "2222" is not PORT=HOST:PORT`},
		{[]string{"--forward", "2222=10.0.0.2:22", "--run-as", "0:0"}, 2, `--run-as "0:0" is not UID:GID of a user other than root`},
		{[]string{"--forward", hp + "=10.0.0.2:22"}, 1, "listening on 127.0.0.1:" + hp},
		{[]string{"--forward", "2222=10.0.0.2:22", "--via-addr", "big:22"}, 2,
			"--via-addr needs --via-user, --via-key, --via-known-hosts too"},
		{[]string{"--forward", "2222=10.0.0.2:22", "--via-key", "k", "--via-known-hosts", "kh"}, 2,
			"--via-key, --via-known-hosts needs --via-addr, --via-user too"},
		{[]string{"--forward", "2222=10.0.0.2:22", "--via-addr", "big", "--via-user", "u", "--via-key", "k", "--via-known-hosts", "kh"}, 2,
			`--via-addr "big" is not HOST:PORT`},
		{[]string{"--forward", hp + "=10.0.0.2:22", "--via-addr", "big:22", "--via-user", "u", "--via-key", filepath.Join(st, "no.key"), "--via-known-hosts", "kh"}, 1,
			"preparing the link to big:22: reading key " + filepath.Join(st, "no.key")},
	} {
		r := run(t, nil, nil, append([]string{"net-forward"}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("net-forward %q: exit %d\n%s\nwant %d, %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
}

// net-forward --via-addr for real: started as root with agent-vm's key for
// the host in a directory only root reaches, it listens, drops to another
// user, and carries a connection to 127.0.0.1:PORT through the SSH link
// to what the host reaches (an echo server), which it cannot reach while
// the host's sshd is stopped; once the sshd is back it makes the link
// again, reading no file.
func TestNetForwardViaLink(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "dropping privileges needs root")
	srv := sshdtest.New(t)
	srv.Start()
	echoL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echoL.Close()
	go func() {
		for {
			c, err := echoL.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	top := t.TempDir() // root's, 0700
	key, pin := filepath.Join(top, "host.key"), filepath.Join(top, "known_hosts")
	for from, to := range map[string]string{srv.KeyFile: key, srv.KnownHosts: pin} {
		b, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(to, b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	var out bytes.Buffer
	fwd := exec.Command(tu.AgentVMBinary(t), "net-forward", "--forward", port+"="+echoL.Addr().String(),
		"--via-addr", srv.Addr, "--via-user", srv.User, "--via-key", key, "--via-known-hosts", pin,
		"--run-as", "65534:65534", "--tag", "via-test")
	fwd.Stdout, fwd.Stderr = &out, &out
	if err := fwd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { fwd.Process.Kill(); fwd.Wait() }()

	echo := func(line string) error {
		var c net.Conn
		var err error
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if perr := tu.Poll(ctx, "the exposed port to accept", func() bool { c, err = net.Dial("tcp", "127.0.0.1:"+port); return err == nil }); perr != nil {
			return fmt.Errorf("%w: %w", perr, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, line); err != nil {
			return err
		}
		got := make([]byte, len(line))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if string(got) != line {
			return fmt.Errorf("echoed %q, want %q", got, line)
		}
		return nil
	}
	if err := echo("through the link"); err != nil {
		t.Fatalf("a connection through net-forward --via-addr: %v\n%s", err, out.String())
	}
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(fwd.Process.Pid) + "/status")
	if !strings.Contains(string(status), "\nUid:\t65534\t65534\t65534\t65534\n") {
		t.Errorf("net-forward did not drop to 65534:\n%s", status)
	}
	// With the host's sshd gone the destination is out of reach (it is
	// reached through the link, not from here), and back with it.
	srv.Stop()
	if err := echo("no link"); err == nil {
		t.Errorf("a connection was carried with the host's sshd stopped: not through the link")
	}
	srv.Start()
	if err := echo("through the link made again"); err != nil {
		t.Errorf("after the host's sshd restarted: %v\n%s", err, out.String())
	}
}
