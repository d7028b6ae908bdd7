package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agent-vm/agent-vm/blackbox"
)

// StatusKeys are the fields every status object has, running or not.
func StatusKeys() []string {
	return []string{"branch", "slug", "backend", "state", "created_at", "ports", "resources",
		"agent", "ssh", "mcp", "paths", "git"}
}

// RunningKeys are the fields a running VM's status has besides StatusKeys.
func RunningKeys() []string {
	return append(StatusKeys(), "pid", "started_at", "uptime_seconds", "accel", "share")
}

// ParseStatus reads one status object and checks that it has the keys.
func ParseStatus(data []byte, keys []string) (*blackbox.Status, error) {
	var st blackbox.Status
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("not a JSON status object: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	var missing []string
	for _, k := range keys {
		if _, ok := raw[k]; !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the status object lacks the documented field(s) %s", strings.Join(missing, ", "))
	}
	return &st, nil
}

// ParseList reads `list --json`: an array of status objects.
func ParseList(data []byte) ([]blackbox.Status, []map[string]json.RawMessage, error) {
	var list []blackbox.Status
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, nil, fmt.Errorf("not a JSON array of status objects: %w", err)
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, nil, err
	}
	return list, raw, nil
}

// ParseTable reads a table whose first line names the columns, aligned as
// text/tabwriter aligns them: each cell starts where its header starts
// (counted in runes). The last column runs to the end of the line.
func ParseTable(out string) (header []string, rows []map[string]string, err error) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || strings.TrimSpace(lines[0]) == "" {
		return nil, nil, fmt.Errorf("no table: the output is empty")
	}
	head := []rune(lines[0])
	var starts []int
	for i, r := range head {
		if r != ' ' && (i == 0 || head[i-1] == ' ') {
			starts = append(starts, i)
		}
	}
	for i, st := range starts {
		end := len(head)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		header = append(header, strings.TrimSpace(string(head[st:end])))
	}
	for _, l := range lines[1:] {
		r := []rune(l)
		row := map[string]string{}
		for i, st := range starts {
			end := len(r)
			if i+1 < len(starts) && starts[i+1] < end {
				end = starts[i+1]
			}
			if st < len(r) {
				row[header[i]] = strings.TrimSpace(string(r[st:end]))
			}
		}
		rows = append(rows, row)
	}
	return header, rows, nil
}

// SSHHost is one `Host` block of an OpenSSH config.
type SSHHost struct {
	Name string
	// Options maps lowercased keywords to their values.
	Options map[string]string
}

// ParseSSHConfig reads Host blocks: "Host NAME" then "Keyword value"
// lines (comments and blank lines skipped).
func ParseSSHConfig(out string) ([]SSHHost, error) {
	var hosts []SSHHost
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("line %d %q: want `Keyword value`", n, line)
		}
		key, value = strings.ToLower(key), strings.TrimSpace(value)
		if key == "host" {
			hosts = append(hosts, SSHHost{Name: value, Options: map[string]string{}})
			continue
		}
		if len(hosts) == 0 {
			return nil, fmt.Errorf("line %d %q comes before any Host line", n, line)
		}
		hosts[len(hosts)-1].Options[key] = value
	}
	return hosts, sc.Err()
}
