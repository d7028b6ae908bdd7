package vagrant

import (
	"fmt"
	"strings"
)

// Line is one line of vagrant's --machine-readable output:
// timestamp,target,type,data... (vagrant's lib/vagrant/ui.rb,
// MachineReadable#machine).
type Line struct {
	Timestamp string
	Target    string
	Type      string
	Data      []string
}

// ParseMachineReadable splits vagrant's machine-readable output into lines
// and decodes each field: vagrant writes "," in data as %!(VAGRANT_COMMA),
// a newline as the two characters \n and a carriage return as \r (it does
// not escape a backslash, so a literal "\n" in data reads as a newline).
// Lines that are not of that form (a plugin's stray output) are skipped.
func ParseMachineReadable(out []byte) []Line {
	var lines []Line
	for _, raw := range strings.Split(strings.ReplaceAll(string(out), "\r\n", "\n"), "\n") {
		fields := strings.Split(raw, ",")
		if len(fields) < 3 || fields[0] == "" || strings.Trim(fields[0], "0123456789") != "" {
			continue
		}
		l := Line{Timestamp: fields[0], Target: decodeField(fields[1]), Type: decodeField(fields[2])}
		for _, d := range fields[3:] {
			l.Data = append(l.Data, decodeField(d))
		}
		lines = append(lines, l)
	}
	return lines
}

func decodeField(s string) string {
	return strings.NewReplacer(`%!(VAGRANT_COMMA)`, ",", `\n`, "\n", `\r`, "\r").Replace(s)
}

// Status is what `vagrant status --machine-readable` says of one machine.
type Status struct {
	State    string // vagrant's state id: running, shutoff, not_created ...
	Provider string
	Long     string // state-human-long
	// Reason is libvirt's reason for a shut-off or paused domain
	// (DomState.Reason), which the driver adds; "" when libvirt could not
	// say.
	Reason string
}

// ParseStatus reads machine's status from `vagrant status
// --machine-readable` output. An error-exit line is vagrant's own error,
// returned with its message.
func ParseStatus(out []byte, machine string) (Status, error) {
	var st Status
	for _, l := range ParseMachineReadable(out) {
		first := ""
		if len(l.Data) > 0 {
			first = l.Data[0]
		}
		switch {
		case l.Type == "error-exit":
			return Status{}, fmt.Errorf("vagrant failed: %s", strings.TrimSpace(strings.Join(l.Data[min(1, len(l.Data)):], ",")))
		case l.Target != machine:
		case l.Type == "state":
			st.State = first
		case l.Type == "provider-name":
			st.Provider = first
		case l.Type == "state-human-long":
			st.Long = strings.TrimSpace(first)
		}
	}
	if st.State == "" {
		return Status{}, fmt.Errorf("vagrant status said nothing of machine %q", machine)
	}
	return st, nil
}
