package hostbrowser

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/ports"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// Which way `run --chrome` would take, from what the host has. The
// browser on PATH is a FAKE at the exec boundary (it answers --version);
// the bridge socket is real, in a directory of the test's own. Port 9222
// itself is this host's: the cases that need it free or answering are
// skipped when it is not so.
func TestDoctorSaysWhichWayRunChromeTakes(t *testing.T) {
	free := ports.Listenable(DefaultPort)
	if !free {
		if _, err := bridge.ProbeDevTools(context.Background(), bridge.DevToolsAddr(DefaultPort)); err == nil {
			tu.SkipOrFail(t, "a browser's DevTools endpoint answers on this host's 127.0.0.1:9222")
		}
	}
	withChromium := func() *execxtest.Fake {
		f := execxtest.New(t)
		f.Installed("chromium", "/usr/bin/chromium")
		f.On("chromium", func(c execxtest.Call) execxtest.Reply {
			if strings.Join(c.Args, " ") != "--version" {
				t.Errorf("chromium %q, want --version", c.Args)
			}
			return execxtest.Reply{Stdout: "Chromium 156.0.8078.108 built on Debian GNU/Linux 12 (bookworm)\n"}
		})
		return f
	}
	bridgeDir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(bridgeDir, "native.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	env := func(dir string) func(string) string {
		return func(k string) string { return map[string]string{bridge.ChromeBridgeDirEnv: dir}[k] }
	}

	f := Doctor(context.Background(), withChromium(), env(bridgeDir))
	if f.Chrome != ViaBridge || f.Bridge != filepath.Join(bridgeDir, "native.sock") || f.Binary != "/usr/bin/chromium" || f.Version != "Chromium 156.0.8078.108 built on Debian GNU/Linux 12 (bookworm)" {
		t.Errorf("with a bridge and Chromium: %+v", f)
	}
	if !free {
		return
	}
	noBridge := env(filepath.Join(t.TempDir(), "none"))
	f = Doctor(context.Background(), withChromium(), noBridge)
	if f.Chrome != ViaLaunch || !strings.Contains(f.BridgeProblem, "run `claude --chrome` on the host") || !strings.Contains(f.DevToolsProblem, "nothing answers on 127.0.0.1:9222") {
		t.Errorf("with Chromium only: %+v", f)
	}
	f = Doctor(context.Background(), execxtest.New(t), noBridge)
	if f.Chrome != "none: "+NoBrowserHint || !strings.Contains(f.BinaryProblem, "no Chrome or Chromium on PATH") {
		t.Errorf("with nothing: %+v", f)
	}
}

// A DevTools endpoint that answers (a real HTTP server answering as
// Chrome does) is the way when there is no bridge.
func TestDoctorTakesAnAnsweringEndpoint(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"Browser": "Chrome/141.0.7390.54", "Protocol-Version": "1.3", "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/x"}`))
	}))
	defer s.Close()
	noBridge := func(k string) string {
		return map[string]string{bridge.ChromeBridgeDirEnv: filepath.Join(t.TempDir(), "none")}[k]
	}
	f := doctor(context.Background(), execxtest.New(t), noBridge, s.Listener.Addr().String())
	if f.Chrome != ViaDevTools || f.DevTools == nil || f.DevTools.Browser != "Chrome/141.0.7390.54" {
		t.Errorf("with an endpoint: %+v", f)
	}
}
