package hostlink

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
)

// The link for real: this machine's sshd stand-in (internal/sshx/sshdtest,
// root) as the host, and its libvirtd (the fixture). The host key read
// by ScanHostKey is the server's; with it pinned and agent-vm's own key
// authorized, libvirt answers over the link as it does locally; a key
// not authorized, and a host key other than the pinned one, are refused
// with what to do.
func TestLinkForReal(t *testing.T) {
	srv := sshdtest.New(t)
	daemon := libvirtd.ForTest(t)
	srv.Start()
	ctx := context.Background()
	dir := t.TempDir()

	key, err := ScanHostKey(ctx, srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(key.Marshal(), srv.HostKey.Public.Marshal()) || !strings.HasPrefix(Fingerprint(key), "SHA256:") {
		t.Fatalf("scanned %s, want the server's %s", Fingerprint(key), Fingerprint(srv.HostKey.Public))
	}
	pinned := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(pinned, []byte(PinLine(srv.Addr, key)), 0o600); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "keys", "big.key")
	pub, err := Keys(keyFile, "agent-vm host big")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 || !strings.HasPrefix(pub, "ssh-ed25519 ") {
		t.Fatalf("key %v %v, public %q", fi, err, pub)
	}
	target := Target{Addr: srv.Addr, User: srv.User, KeyFile: keyFile, KnownHosts: pinned}

	if _, err := Dial(ctx, target); err == nil || !strings.Contains(err.Error(), "does not accept agent-vm's key") || !strings.Contains(err.Error(), keyFile+".pub") {
		t.Errorf("before the key is authorized: %v", err)
	}
	srv.Authorize([]byte(pub))
	c, err := Dial(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := Libvirt(c)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Disconnect()
	v, err := l.ConnectGetLibVersion()
	if err != nil {
		t.Fatal(err)
	}
	out, err := daemon.Virsh(ctx, "version")
	want := []string{"libvirt", formatVersion(v)}
	if err != nil || !strings.Contains(out, strings.Join(want, " ")) {
		t.Errorf("libvirt over the link says %s; virsh version says:\n%s (%v)", formatVersion(v), out, err)
	}

	other, _ := sshkeys.Generate("another host")
	if err := os.WriteFile(pinned, []byte(PinLine(srv.Addr, other.Public)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(ctx, target); err == nil || !strings.Contains(err.Error(), "other than the one pinned") || !strings.Contains(err.Error(), "host add") {
		t.Errorf("with another host key pinned: %v", err)
	}
}

func TestScanRefusals(t *testing.T) {
	if _, err := ScanHostKey(context.Background(), "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("nothing listening: %v", err)
	}
}
