package vagrant

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/driver"
)

// ParseSSHConfig reads the Host block of machine in `vagrant ssh-config`
// output: ssh_config syntax (keyword and arguments split by blanks or one
// "=", arguments in double quotes, # comments, keywords case-insensitive).
// It refuses what agent-vm cannot reach (a ProxyCommand or ProxyJump, which
// vagrant writes for a remote libvirt host) and an incomplete block.
func ParseSSHConfig(out []byte, machine string) (driver.SSHEndpoint, error) {
	var e driver.SSHEndpoint
	found, in := false, false
	for n, raw := range strings.Split(string(out), "\n") {
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, args, err := sshConfigLine(line)
		if err != nil {
			return driver.SSHEndpoint{}, fmt.Errorf("vagrant ssh-config, line %d: %w", n+1, err)
		}
		if key == "host" {
			in = len(args) == 1 && args[0] == machine
			found = found || in
			continue
		}
		if !in {
			continue
		}
		switch key {
		case "hostname":
			e.Host = args[0]
		case "port":
			p, err := strconv.Atoi(args[0])
			if err != nil || p < 1 || p > 65535 {
				return driver.SSHEndpoint{}, fmt.Errorf("vagrant ssh-config, line %d: port %q is not a port number", n+1, args[0])
			}
			e.Port = p
		case "user":
			e.User = args[0]
		case "identityfile":
			e.IdentityFiles = append(e.IdentityFiles, args[0])
		case "proxycommand", "proxyjump":
			return driver.SSHEndpoint{}, fmt.Errorf("vagrant reaches machine %q through a %s, which agent-vm does not run (hint: use `vagrant ssh` in the repository with the environment `agent-vm status` shows)", machine, key)
		default:
			e.Options = append(e.Options, [2]string{key, strings.Join(args, " ")})
		}
	}
	switch {
	case !found:
		return driver.SSHEndpoint{}, fmt.Errorf("vagrant ssh-config has no Host block for machine %q", machine)
	case e.Host == "" || e.User == "" || len(e.IdentityFiles) == 0:
		return driver.SSHEndpoint{}, fmt.Errorf("vagrant ssh-config's block for machine %q lacks a HostName, User or IdentityFile (hint: a Vagrantfile that logs in with a password is not supported)", machine)
	}
	if e.Port == 0 {
		e.Port = 22
	}
	return e, nil
}

// sshConfigLine splits one ssh_config line into its lowercased keyword and
// its arguments.
func sshConfigLine(line string) (string, []string, error) {
	i := strings.IndexAny(line, " \t=")
	if i <= 0 {
		return "", nil, fmt.Errorf("%q is not a keyword with arguments", line)
	}
	key, rest := line[:i], strings.TrimLeft(line[i:], " \t")
	if strings.HasPrefix(rest, "=") {
		rest = strings.TrimLeft(rest[1:], " \t")
	}
	var args []string
	for rest != "" {
		if rest[0] == '"' {
			end := strings.IndexByte(rest[1:], '"')
			if end < 0 {
				return "", nil, fmt.Errorf("unterminated quote in %q", line)
			}
			args = append(args, rest[1:end+1])
			rest = strings.TrimLeft(rest[end+2:], " \t")
			continue
		}
		j := strings.IndexAny(rest, " \t")
		if j < 0 {
			j = len(rest)
		}
		args = append(args, rest[:j])
		rest = strings.TrimLeft(rest[j:], " \t")
	}
	if len(args) == 0 {
		return "", nil, fmt.Errorf("%q is not a keyword with arguments", line)
	}
	return strings.ToLower(key), args, nil
}

// ForeignSSH asks vagrant how to reach a running machine of the
// repository's own Vagrantfile (`vagrant ssh-config NAME`, parsed). A
// machine of agent-vm's own Vagrantfile is reached with its pinned key
// instead, so asking is an error.
func (d *Driver) ForeignSSH(ctx context.Context, m driver.Machine) (driver.SSHEndpoint, error) {
	if _, ok, err := userOf(m); err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("internal error: %s runs agent-vm's Vagrantfile, reached with its pinned key, not vagrant's ssh-config", m.Name)
		}
		return driver.SSHEndpoint{}, err
	}
	name := MachineName(m)
	res, err := d.vagrant(ctx, m, false, "ssh-config", "--no-color", name)
	if err != nil {
		return driver.SSHEndpoint{}, fmt.Errorf("%w (hint: the VM must be running: `agent-vm start %s`)", err, short(m))
	}
	return ParseSSHConfig(res.Stdout, name)
}
