package cli

import (
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/cmdline"
)

func TestInterspersedFlags(t *testing.T) {
	app := newApp(IO{})
	cases := map[string]string{
		"agent-vm destroy x --force":              "agent-vm destroy --force x",
		"agent-vm --state-dir /s status x --json": "agent-vm --state-dir /s status --json x",
		"agent-vm create --branch b --memory 2G":  "agent-vm create --branch b --memory 2G",
		"agent-vm create b --memory 2G":           "agent-vm create --memory 2G b",
		"agent-vm logs x -n 5 -f":                 "agent-vm logs -n 5 -f x",
		"agent-vm start x --timeout 10m":          "agent-vm start --timeout 10m x",
		"agent-vm exec x -- ls --force":           "agent-vm exec x -- ls --force",
		"agent-vm -v destroy x --force -- y":      "agent-vm -v destroy --force x -- y",
		"agent-vm --log-format json list --json":  "agent-vm --log-format json list --json",
		"agent-vm status --json=true x":           "agent-vm status --json=true x",
		"agent-vm port list x --json":             "agent-vm port list --json x",
		"agent-vm port add x 3000":                "agent-vm port add x 3000",
		"agent-vm port add 3000 4000 --vm x":      "agent-vm port add --vm x 3000 4000",
		"agent-vm image list --json":              "agent-vm image list --json",
	}
	for in, want := range cases {
		if got := strings.Join(cmdline.Interspersed(app, strings.Fields(in)), " "); got != want {
			t.Errorf("%s\n got %s\nwant %s", in, got, want)
		}
	}
}
