package blackbox

import "time"

// Status is one object of `agent-vm status --json` and `list --json`: the
// fields docs/usage.md documents, written down here from the CLI contract rather
// than imported, because black-box code may use agent-vm only through its
// command line.
type Status struct {
	Branch  string `json:"branch"`
	Slug    string `json:"slug"`
	Backend string `json:"backend"`
	State   string `json:"state"`
	// Suspend is how a suspended VM keeps its memory: "paused",
	// "hibernated", "saved".
	Suspend   string    `json:"suspend"`
	Detail    string    `json:"detail"`
	CreatedAt time.Time `json:"created_at"`
	Ports     struct {
		SSH int `json:"ssh"`
		MCP int `json:"mcp"`
	} `json:"ports"`
	// Forwards are the VM's own port forwards (`agent-vm port add`).
	Forwards []struct {
		Guest int `json:"guest"`
		Host  int `json:"host"`
	} `json:"forwards"`
	Resources struct {
		CPUs      int `json:"cpus"`
		MemoryMiB int `json:"memory_mib"`
		DiskGiB   int `json:"disk_gib"`
	} `json:"resources"`
	Accel         string     `json:"accel"`
	AccelReason   string     `json:"accel_reason"`
	Share         string     `json:"share"`
	Pid           int        `json:"pid"`
	StartedAt     *time.Time `json:"started_at"`
	UptimeSeconds int64      `json:"uptime_seconds"`
	Agent         struct {
		State  string `json:"state"`
		Detail string `json:"detail"`
	} `json:"agent"`
	SSH struct {
		Host           string `json:"host"`
		Port           int    `json:"port"`
		User           string `json:"user"`
		IdentityFile   string `json:"identity_file"`
		KnownHostsFile string `json:"known_hosts_file"`
		Alias          string `json:"alias"`
	} `json:"ssh"`
	MCP struct {
		URL       string `json:"url"`
		HealthURL string `json:"health_url"`
		Token     string `json:"token"`
	} `json:"mcp"`
	Paths struct {
		Dir        string `json:"dir"`
		Workspace  string `json:"workspace"`
		ConsoleLog string `json:"console_log"`
	} `json:"paths"`
	Git struct {
		Source      string `json:"source"`
		Repo        string `json:"repo"`
		OriginURL   string `json:"origin_url"`
		UpstreamURL string `json:"upstream_url"`
	} `json:"git"`
	HostCA   bool   `json:"host_ca"`
	AgentCLI string `json:"agent_cli"`
	Error    string `json:"error"`
}
