package scenario

import "github.com/agent-vm/agent-vm/integration/harness"

// All lists the scenarios in the order they run.
func All() []harness.Scenario {
	return []harness.Scenario{
		Template("claude"),
		cliScenario(),
		lifecycleScenario(),
		severalScenario(),
		mcpScenario(),
		sessionsScenario(),
		// Last of those that start from the run's template: it rebuilds it.
		agentCLIScenario(),
	}
}
