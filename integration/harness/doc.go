// Package harness runs agent-vm's end-to-end test for the integration-test
// binary: its flags (Config), the run of the selected scenarios and the
// cleanup after each, the report a user reads, and the way a scenario
// drives the agent-vm binary (S: its steps, its agent-vm calls, the VMs it
// made). It drives agent-vm only through its command line (os/exec), as a
// user would, and knows no scenario: the scenarios (package scenario)
// import it, and the binary hands their Suite to Run.
//
// It imports nothing of agent-vm's internal packages (deps_test.go
// enforces it, for the scenarios too): the JSON it reads is written down
// here from the documented CLI contract. Each scenario makes its own test
// data (git repositories with a bare remote, made with the real git) in a
// temporary directory, and the run always cleans up after it: on success,
// failure, SIGINT or SIGTERM it stops and destroys the VMs the scenario
// made and removes its files, unless --keep keeps a failed scenario's for
// debugging.
//
// Scenarios that need what the host lacks (no qemu, no base image, an
// agent-vm without the command) are skipped with the reason and the
// command that would enable them; with AGENT_VM_TEST_STRICT=1 they fail.
package harness
