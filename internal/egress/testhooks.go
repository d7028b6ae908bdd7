//go:build agentvm_testhooks

package egress

// TestHooks says whether this binary reads the proxy's test hooks
// (TestHostsEnv, TestRootCAEnv): only a build with the agentvm_testhooks
// tag, which the tests and integration-test's agent-vm are; a shipped
// agent-vm ignores them (testhooks_off.go).
const TestHooks = true
