package hosts

import (
	"strings"
	"testing"
)

func TestParseURIAccepts(t *testing.T) {
	for _, c := range []struct {
		in     string
		want   URI
		checks string
	}{
		{"qemu:///system", URI{Daemon: "system"}, "qemu:///system"},
		{"qemu:///session", URI{Daemon: "session"}, "qemu:///session"},
		{"qemu+unix:///system", URI{Transport: "unix", Daemon: "system"}, "qemu+unix:///system"},
		{"qemu+ssh://server/system", URI{Transport: "ssh", Host: "server", Daemon: "system"}, "qemu+ssh://server/system?no_tty=1"},
		{"qemu+ssh://ann@big.example.com:2222/session", URI{Transport: "ssh", User: "ann", Host: "big.example.com", Port: 2222, Daemon: "session"},
			"qemu+ssh://ann@big.example.com:2222/session?no_tty=1"},
		{"qemu+ssh://root@192.0.2.7/system?keyfile=/home/ann/.ssh/id_ed25519",
			URI{Transport: "ssh", User: "root", Host: "192.0.2.7", Daemon: "system", Keyfile: "/home/ann/.ssh/id_ed25519"},
			"qemu+ssh://root@192.0.2.7/system?keyfile=/home/ann/.ssh/id_ed25519&no_tty=1"},
		{"qemu+ssh://ann@[2001:db8::1]:22/system", URI{Transport: "ssh", User: "ann", Host: "2001:db8::1", Port: 22, Daemon: "system"},
			"qemu+ssh://ann@[2001:db8::1]:22/system?no_tty=1"},
	} {
		got, err := ParseURI(c.in)
		if err != nil {
			t.Errorf("ParseURI(%q): %v", c.in, err)
			continue
		}
		c.want.Raw = c.in
		if got != c.want {
			t.Errorf("ParseURI(%q) = %+v, want %+v", c.in, got, c.want)
		}
		if got.ForChecks() != c.checks {
			t.Errorf("ParseURI(%q).ForChecks() = %q, want %q", c.in, got.ForChecks(), c.checks)
		}
	}
}

// Each refusal names the URI (or the part of it at fault) and says why or
// what to write instead.
func TestParseURIRefuses(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"", []string{"empty", "qemu:///system"}},
		{"server", []string{`"server" is not a libvirt URI`, "hint"}},
		{"qemu+tcp://server/system", []string{"no authentication", "qemu+ssh://"}},
		{"qemu+tls://server/system", []string{"PKI", "qemu+ssh://"}},
		{"qemu+libssh2://server/system", []string{"~/.ssh/config", "qemu+ssh://"}},
		{"qemu+ext:///system?command=/bin/x", []string{`transport "ext"`, "qemu+ssh://"}},
		{"xen:///system", []string{"xen driver", "QEMU"}},
		{"qemu:///embed?root=/tmp/x", []string{`path "/embed"`, "/system and /session"}},
		{"qemu+ssh://server/", []string{`path "/"`}},
		{"qemu://server/system", []string{"TLS", "qemu+ssh://USER@server/system"}},
		{"qemu:///system?socket=/run/x", []string{"parameters (socket=/run/x)", "qemu:///system"}},
		{"qemu+ssh:///system", []string{"names no host"}},
		{"qemu+ssh://-oProxyCommand=sh/system", []string{"not a host name"}},
		{"qemu+ssh://ann@server:0/system", []string{`port "0"`}},
		{"qemu+ssh://ann@server:70000/system", []string{`port "70000"`}},
		{"qemu+ssh://ann@server:/system", []string{"empty port"}},
		{"qemu+ssh://ann:hunter2@server/system", []string{"password", "ssh-copy-id", "qemu+ssh://ann:xxxxx@server/system"}},
		{"qemu+tcp://ann:hunter2@server/system", []string{"password"}},
		{"qemu+ssh://ann:hunter2@server:x/system", []string{"password"}},
		{"qemu+ssh://:hunter2@server/system", []string{"password"}},
		{"qemu+ssh://-l@server/system", []string{`"-l" is not a user name`}},
		{"qemu+ssh://server/system?no_verify=1", []string{"no_verify", "host key", "known_hosts"}},
		{"qemu+ssh://server/system?known_hosts=/tmp/kh", []string{"known_hosts", "ignore", "UserKnownHostsFile"}},
		{"qemu+ssh://server/system?no_tty=1", []string{"no_tty", "itself"}},
		{"qemu+ssh://server/system?netcat=/bin/nc", []string{"netcat", "does not support"}},
		{"qemu+ssh://server/system?keyfile=id_rsa", []string{`keyfile "id_rsa" is not an absolute path`}},
		{"qemu+ssh://server/system?keyfile=/a&keyfile=/b", []string{"keyfile more than once"}},
		{"qemu+ssh://server/system?", []string{"empty '?'"}},
		{"qemu+ssh://server/system#x", []string{"fragment"}},
	} {
		_, err := ParseURI(c.in)
		if err == nil {
			t.Errorf("ParseURI(%q) accepted it", c.in)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ParseURI(%q): %v\nwant it to say %q", c.in, err, w)
			}
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseURI(%q) printed the password: %v", c.in, err)
		}
	}
}
