// Package blackbox holds what the integration test (integration/) and the
// benchmark harness (bench/) share: both drive agent-vm only from outside,
// as a user would, through its command line, its JSON output and the
// processes it leaves on the host. So this package never imports agent-vm's
// internal packages (integration/harness/deps_test.go checks it); it knows
// agent-vm only by its documented contract.
//
// It holds the rule for what a host cannot do (Strict, Need, SkipOrFail),
// running a program the way a terminal user would stop it (Run), the
// documented `status --json` object (Status), and the host's processes as
// /proc shows them (Processes).
package blackbox
