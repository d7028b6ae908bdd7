package cloudinit

import (
	"errors"
	"strings"
	"testing"
)

func TestValidConfigs(t *testing.T) {
	for name, c := range goldenCases(t) {
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := testConfig(t)
	c.UID, c.GID = 4294967294, 1 // the extremes that are still fine
	c.MCP.Port = 65535
	c.MCP.AllowOrigins = []string{"http://[::1]:8080", "https://a.example.com"}
	if err := c.Validate(); err != nil {
		t.Errorf("extremes: %v", err)
	}
}

func TestInvalidConfigs(t *testing.T) {
	other := strings.TrimSpace(readFixture(t, "other_ed25519.pub"))
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // the error names the input ...
		hint   string // ... and, where there is one, the fix
	}{
		{"uid 0", func(c *Config) { c.UID = 0 }, "uid 0 (root)", "its account agent-vm"},
		{"system uid", func(c *Config) { c.UID = 999 }, "uid 999 would clash", "uid 1000 or more with chown -R"},
		{"negative uid", func(c *Config) { c.UID = -1 }, "uid -1 is out of range", ""},
		{"nobody uid", func(c *Config) { c.UID = 65534 }, "uid 65534 is reserved", ""},
		{"huge uid", func(c *Config) { c.UID = 1 << 32 }, "out of range", ""},
		{"gid 0", func(c *Config) { c.GID = 0 }, "gid 0 (root)", "its account agent-vm"},
		{"nogroup", func(c *Config) { c.GID = 65534 }, "gid 65534 is reserved", ""},
		{"no keys", func(c *Config) { c.AuthorizedKeys = nil }, "no authorized key", "id_ed25519.pub"},
		{"empty key", func(c *Config) { c.AuthorizedKeys = []string{""} }, "authorized key 1: is empty", "ssh-ed25519 AAAA"},
		{"key with newline", func(c *Config) { c.AuthorizedKeys = []string{other + "\nssh-ed25519 AAAA x"} }, `contains the character '\n'`, ""},
		{"key with options", func(c *Config) { c.AuthorizedKeys = []string{`command="rm -rf /" ` + other} }, "unknown key type", ""},
		{"key not base64", func(c *Config) { c.AuthorizedKeys = []string{"ssh-ed25519 !!!"} }, "not base64", ""},
		{"key type lies", func(c *Config) { c.AuthorizedKeys = []string{"ssh-rsa " + strings.Fields(other)[1]} }, `says "ssh-rsa" but its key data does not`, ""},
		{"second key bad", func(c *Config) { c.AuthorizedKeys = append(c.AuthorizedKeys, "nonsense") }, "authorized key 2", ""},
		{"no host key", func(c *Config) { c.HostKey = HostKey{} }, "host key: both", "ssh-keygen"},
		{"host key mismatch", func(c *Config) { c.HostKey.Public = other }, "does not match the host public key", ""},
		{"host key rsa", func(c *Config) {
			c.HostKey.Public = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7"
		}, "host public key", ""},
		{"host key encrypted", func(c *Config) {
			c.HostKey.Private = readFixture(t, "encrypted_ed25519")
		}, "is encrypted", "ssh-keygen -N ''"},
		{"host key not pem", func(c *Config) { c.HostKey.Private = "hello" }, "not an OpenSSH private key", ""},
		{"host key trailing text", func(c *Config) { c.HostKey.Private += "runcmd: [reboot]\n" }, "text after the key", ""},
		{"empty instance id", func(c *Config) { c.InstanceID = "" }, `instance id ""`, ""},
		{"instance id with slash", func(c *Config) { c.InstanceID = "../x" }, `instance id "../x"`, ""},
		{"empty hostname", func(c *Config) { c.Hostname = "" }, `hostname ""`, "lowercase"},
		{"hostname injection", func(c *Config) { c.Hostname = "x\nruncmd: [reboot]" }, "is not a DNS label", ""},
		{"hostname shell", func(c *Config) { c.Hostname = "$(reboot)" }, "is not a DNS label", ""},
		{"hostname dots", func(c *Config) { c.Hostname = "a.example.com" }, "is not a DNS label", ""},
		{"hostname upper", func(c *Config) { c.Hostname = "Feat-X" }, "is not a DNS label", "lowercase"},
		{"hostname dash", func(c *Config) { c.Hostname = "-x" }, "is not a DNS label", ""},
		{"hostname long", func(c *Config) { c.Hostname = strings.Repeat("a", 64) }, "is not a DNS label", "1-63"},
		{"low port", func(c *Config) { c.MCP.Port = 80 }, "mcp port 80 is out of range", "1024-65535"},
		{"ssh port", func(c *Config) { c.MCP.Port = 22 }, "mcp port 22", ""},
		{"high port", func(c *Config) { c.MCP.Port = 65536 }, "mcp port 65536", ""},
		{"negative port", func(c *Config) { c.MCP.Port = -1 }, "mcp port -1", ""},
		{"origin path", func(c *Config) { c.MCP.AllowOrigins = []string{"https://claude.ai/x"} }, "more than scheme, host and port", "scheme://host[:port]"},
		{"origin scheme", func(c *Config) { c.MCP.AllowOrigins = []string{"javascript://x"} }, "not http or https", ""},
		{"origin quote", func(c *Config) { c.MCP.AllowOrigins = []string{`https://a" b`} }, `contains '"'`, ""},
		{"origin space", func(c *Config) { c.MCP.AllowOrigins = []string{"https://a https://b"} }, `contains ' '`, ""},
		{"origin wildcard", func(c *Config) { c.MCP.AllowOrigins = []string{"*"} }, `contains '*'`, ""},
		{"origin no host", func(c *Config) { c.MCP.AllowOrigins = []string{"https://"} }, "has no host", ""},
		{"mcp config not json", func(c *Config) { c.MCP.Config = []byte("{") }, "not a JSON object", "mcpServers"},
		{"mcp config array", func(c *Config) { c.MCP.Config = []byte("[]") }, "not a JSON object", ""},
		{"package", func(c *Config) { c.ExtraPackages = []string{"rm -rf"} }, `package name "rm -rf"`, ""},
		{"package option", func(c *Config) { c.ExtraPackages = []string{"-y"} }, `package name "-y"`, ""},
		{"mac", func(c *Config) { c.MACAddress = "52:54:00:12:34" }, `mac address "52:54:00:12:34"`, DefaultMACAddress},
		{"mac upper", func(c *Config) { c.MACAddress = "52:54:00:AB:CD:EF" }, "lowercase", ""},
		{"mac multicast", func(c *Config) { c.MACAddress = "01:00:5e:00:00:01" }, "multicast", ""},
		{"npm package", func(c *Config) { c.NPMPackages = []string{"--global"} }, `npm package name "--global"`, ""},
		{"npm package url", func(c *Config) { c.NPMPackages = []string{"git+https://evil/x"} }, "not valid", ""},
		{"npm program package", func(c *Config) { c.NPMPrograms = []string{"--omit=dev"} }, `npm package name "--omit=dev"`, ""},
		{"npm package range", func(c *Config) { c.NPMPackages = []string{"@anthropic-ai/claude-code@^2.1"} }, "not valid", ""},
		{"npm package version url", func(c *Config) { c.NPMPackages = []string{"x@https://evil/x.tgz"} }, "not valid", ""},
		{"ca not pem", func(c *Config) { c.CACerts = []string{"not a certificate"} }, "CA certificate 1 is not one PEM CERTIFICATE block", ""},
		{"ca key", func(c *Config) {
			c.CACerts = []string{"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}
		}, "CA certificate 1 is not one PEM CERTIFICATE block", ""},
		{"ca two in one", func(c *Config) {
			ca := readFixture(t, "host-ca.pem")
			c.CACerts = []string{ca + ca}
		}, "CA certificate 1 is not one PEM CERTIFICATE block", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig(t)
			tt.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) || !strings.Contains(msg, tt.hint) {
				t.Errorf("got %q, want it to contain %q and %q", msg, tt.want, tt.hint)
			}
			if msg != strings.ToLower(msg[:1])+msg[1:] {
				t.Errorf("error %q does not start lowercase", msg)
			}
			if _, rerr := Render(c); rerr == nil {
				t.Error("Render accepted what Validate refuses")
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := testConfig(t)
	c.UID, c.Hostname, c.MCP.Port = 0, "Bad_Host", 1
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted it")
	}
	for _, want := range []string{"uid 0", `hostname "Bad_Host"`, "mcp port 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 3 {
		t.Errorf("want the three problems as separate errors, got %v", err)
	}
}

// FuzzRenderIsPlainYAML renders configs with fuzzed free-form input and
// checks that whatever passes validation renders to printable ASCII JSON.
func FuzzRenderIsPlainYAML(f *testing.F) {
	f.Add("feat-x", "i-1", "https://claude.ai", []byte(`{"mcpServers": {}}`), "ripgrep")
	f.Add("x\n", "\u2028", "http://[::1]:1", []byte("{\"a\": \"\u0085\u2028\U0001F642\x7f\"}"), "a+b")
	f.Fuzz(func(t *testing.T, hostname, instanceID, origin string, mcpConfig []byte, pkg string) {
		c := testConfig(t)
		c.Hostname, c.InstanceID = hostname, instanceID
		c.MCP.AllowOrigins = []string{origin}
		c.MCP.Config = mcpConfig
		c.ExtraPackages = []string{pkg}
		seed, err := Render(c)
		if err != nil {
			return
		}
		for _, doc := range [][]byte{seed.UserData, seed.MetaData, seed.NetworkConfig} {
			for i, ch := range doc {
				if (ch < 0x20 || ch > 0x7e) && ch != '\n' {
					t.Fatalf("byte %#x at %d is not printable ASCII", ch, i)
				}
			}
		}
		parseUserData(t, seed.UserData)
	})
}
