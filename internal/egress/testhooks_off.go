//go:build !agentvm_testhooks

package egress

// TestHooks: see testhooks.go. Off: the environment cannot lead a
// proxy's names elsewhere nor make it trust another CA.
const TestHooks = false
