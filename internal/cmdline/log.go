package cmdline

import (
	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"
)

// LogFlags are the global flags that shape the logger: --verbose,
// --log-format and --no-color.
func LogFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "log debug details"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format on stderr: text or json"},
		&cli.BoolFlag{Name: "no-color", Usage: "no colour in logs (also: NO_COLOR)"},
	}
}

// CheckLogFormat refuses a --log-format other than text or json.
func CheckLogFormat(cliCtx *cli.Context) error {
	if f := cliCtx.String("log-format"); f != "text" && f != "json" {
		return Usagef("--log-format %q: must be text or json", f)
	}
	return nil
}

// Logger is the logger LogFlags ask for (read from any command's context):
// stderr, no timestamps in text (a command's lines are read as they
// happen), JSON with them.
func Logger(cliCtx *cli.Context, stdio IO) hclog.Logger {
	return logger(cliCtx, stdio, false)
}

// ServiceLogger is Logger for a process that runs on by itself (a VM's
// holder, its egress proxy), whose stderr is a log file read later, when
// something went wrong: each line says when it happened.
func ServiceLogger(cliCtx *cli.Context, stdio IO) hclog.Logger {
	return logger(cliCtx, stdio, true)
}

func logger(cliCtx *cli.Context, stdio IO, timed bool) hclog.Logger {
	level := hclog.Info
	if cliCtx.Bool("verbose") {
		level = hclog.Debug
	}
	color := hclog.AutoColor
	if cliCtx.Bool("no-color") || stdio.Getenv("NO_COLOR") != "" {
		color = hclog.ColorOff
	}
	json := cliCtx.String("log-format") == "json"
	return hclog.New(&hclog.LoggerOptions{
		Name: "agent-vm", Level: level, Output: stdio.Err, JSONFormat: json,
		DisableTime: !json && !timed, Color: color,
	})
}
