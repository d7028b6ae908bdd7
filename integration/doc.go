// Package integration is agent-vm's end-to-end test, run by the
// integration-test binary: scenarios that drive the agent-vm binary only
// through its command line (os/exec), as a user would, and report whether
// this build works on this host.
//
// It imports nothing of agent-vm's internal packages (a test enforces it):
// the JSON it reads is written down here from the documented CLI contract.
// Each scenario makes its own test data (git repositories with a bare
// remote, made with the real git) in a temporary directory, and always
// cleans up after itself: on success, failure, SIGINT or SIGTERM it stops
// and destroys the VMs it made and removes its files, unless --keep keeps
// a failed scenario's for debugging.
//
// Scenarios that need what the host lacks (no qemu, no base image, an
// agent-vm without the command) are skipped with the reason and the
// command that would enable them; with AGENT_VM_TEST_STRICT=1 they fail.
package integration
