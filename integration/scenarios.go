package integration

// Scenarios lists the scenarios in the order they run.
func Scenarios() []Scenario {
	return []Scenario{
		templateScenario("claude"),
		cliScenario(),
		lifecycleScenario(),
		severalScenario(),
		mcpScenario(),
		sessionsScenario(),
		// Last of those that start from the run's template: it rebuilds it.
		agentCLIScenario(),
	}
}

// Binary is the suite the integration-test binary runs.
func Binary() Suite { return Suite{Scenarios: Scenarios(), Template: templateScenario} }
