// Package scenario holds the end-to-end scenarios the integration-test
// binary runs (All, in their order, and Template, the run's template):
// each a story told through the agent-vm command line, as a user would
// tell it, in named steps on a harness.S, with the checks the stories
// share (a VM's workspace share, network, port forwards, provisioning).
// It reaches agent-vm only through package harness.
package scenario
