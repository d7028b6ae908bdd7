// Package bridge is the host's end of a VM's browser bridges: what of the
// host's browser the guest reaches when the user opens it (agent-vm
// browser, run --chrome), each bridge a reverse forward that the VM's held
// SSH connection (internal/hold) asks the guest's sshd for, so the guest
// listens on a path or port of its own and each connection it accepts
// comes back over that one connection to be served here:
//
//   - the Claude in Chrome bridge: the guest's guest.ChromeBridgeSocket leads to
//     the newest socket the host's Claude in Chrome native host serves
//     (/tmp/claude-mcp-browser-bridge-$USER/*.sock), found again at each
//     connection, as the host's own Claude Code finds it;
//   - the DevTools relay: the guest's 127.0.0.1:guest.DevToolsPort leads to a
//     host browser's remote-debugging endpoint on the host's 127.0.0.1, through
//     agent-vm's relay (CDPRelay), which passes DevTools to the web pages and
//     refuses what reaches the host's files, downloads and the browser's own
//     pages;
//   - the URL opener: the guest's xdg-open writes a URL to guest.OpenURLSocket,
//     and the host checks it (http and https only, rate-limited), logs it in the
//     VM's net log, prints it and opens it with the host's opener.
//
// Which bridges a VM has open is a file in its run directory (Config,
// ConfigFile), which the holder reads when it starts and when told to; a stop
// ends them all with the holder. No bridge opens a TCP port on the host.
package bridge
