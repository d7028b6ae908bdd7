package main

import (
	"bufio"
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/bench/report"
)

// The MCP proxy's figures come from its Go benchmarks
// (internal/mcpproxy/bench_test.go). The harness builds the test binary
// once and runs every benchmark once per run, -mcp-runs times, so the
// proxy and its references alternate (A/B/A/B) rather than each running
// its repetitions back to back as `-count` would.

// benchResult is one line of `go test -bench` output.
type benchResult struct {
	Name    string // without the -GOMAXPROCS suffix
	N       int
	Metrics map[string]float64 // "ns/op", "open-50-sessions-ms", ...
}

// procsSuffix is the -GOMAXPROCS suffix of a benchmark's name.
var procsSuffix = regexp.MustCompile(`-\d+$`)

// parseBench reads `go test -v -bench` output: the results, and why
// skipped benchmarks were skipped (the last line they logged).
func parseBench(out string) (results []benchResult, skipped map[string]string) {
	skipped = map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	logged := ""
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(trimmed, "--- SKIP: "); ok {
			skipped[procsSuffix.ReplaceAllString(strings.Fields(name)[0], "")] = logged
			continue
		}
		if strings.HasPrefix(line, "    ") {
			if _, msg, ok := strings.Cut(trimmed, ": "); ok {
				logged = msg
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		r := benchResult{Name: procsSuffix.ReplaceAllString(f[0], ""), N: n, Metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				r.Metrics[f[i+1]] = v
			}
		}
		results = append(results, r)
	}
	return results, skipped
}

// mcpSamples are benchmark results by benchmark and metric, one value
// per run.
type mcpSamples map[string]map[string][]float64

// runMCPBenchmarks builds the proxy's test binary and runs its benchmarks
// -mcp-runs times; it returns the samples and why benchmarks were skipped.
func runMCPBenchmarks(ctx context.Context, l *lab) (mcpSamples, map[string]string, error) {
	bin := filepath.Join(l.dir, "mcpproxy.test")
	if res := runCmd(ctx, cmdSpec{Path: "go", Args: []string{"test", "-c", "-o", bin, "./internal/mcpproxy"}, Dir: l.cfg.Root, Timeout: 10 * time.Minute}); res.Err != nil {
		return nil, nil, res.Err
	}
	samples, skipped := mcpSamples{}, map[string]string{}
	for run := 1; run <= l.cfg.MCPRuns; run++ {
		l.log.Printf("MCP: benchmark run %d/%d", run, l.cfg.MCPRuns)
		res := runCmd(ctx, cmdSpec{Path: bin, Args: []string{"-test.run", "^$", "-test.bench", ".", "-test.benchtime", "2000x", "-test.count", "1", "-test.v"},
			Dir: filepath.Join(l.cfg.Root, "internal", "mcpproxy"), Timeout: 15 * time.Minute})
		if res.Err != nil {
			return nil, nil, fmt.Errorf("%w%s", res.Err, tailSuffix(res.Stdout))
		}
		results, sk := parseBench(res.Stdout)
		for k, v := range sk {
			skipped[k] = v
		}
		for _, r := range results {
			if samples[r.Name] == nil {
				samples[r.Name] = map[string][]float64{}
			}
			for m, v := range r.Metrics {
				samples[r.Name][m] = append(samples[r.Name][m], v)
			}
		}
	}
	return samples, skipped, nil
}

// runMCP runs the proxy benchmarks and makes rows of them.
func runMCP(ctx context.Context, l *lab, f *report.Figure) error {
	samples, skipped, err := runMCPBenchmarks(ctx, l)
	if err != nil {
		return err
	}
	us := func(name string) []float64 {
		ns := samples[name]["ns/op"]
		out := make([]float64, len(ns))
		for i, v := range ns {
			out[i] = v / 1000
		}
		return out
	}
	for _, srv := range []string{"testserver", "everything"} {
		direct, proxy, fifty := "BenchmarkDirectStdio/"+srv, "BenchmarkProxyStreamable/"+srv, "BenchmarkProxy50Sessions/"+srv
		if samples[proxy] == nil || samples[direct] == nil {
			f.Notes = append(f.Notes, fmt.Sprintf("server %s not measured: %s", srv, orDefault(firstNonEmpty(skipped[proxy], skipped[direct]), "no results")))
			continue
		}
		f.Rows = append(f.Rows, report.NewRow("MCP."+srv+".request", "a request through the proxy (Streamable HTTP, one session), server "+srv, "µs",
			report.NewSeries("through agent-vm mcp-proxy", us(proxy)), report.Ref("stdio to the server directly", us(direct)), true))
		if samples[fifty] != nil {
			f.Rows = append(f.Rows,
				report.NewRow("MCP."+srv+".50-sessions", "a request with 50 sessions busy at once (wall time / requests), server "+srv, "µs",
					report.NewSeries("50 sessions", us(fifty)), report.Ref("one session", us(proxy)), true),
				report.NewRow("MCP."+srv+".open-50", "opening 50 sessions at once (50 initialize requests, each starting a server), server "+srv, "ms",
					report.NewSeries("open 50 sessions", samples[fifty]["open-50-sessions-ms"]), nil, false))
		}
	}
	if p, h := samples["BenchmarkProxyStreamable/testserver"], samples["BenchmarkHTTPBaseline"]; p != nil && h != nil {
		f.Rows = append(f.Rows, report.NewRow("MCP.http", "a request through the proxy, server testserver", "µs",
			report.NewSeries("through agent-vm mcp-proxy", us("BenchmarkProxyStreamable/testserver")), report.Ref("a bare net/http handler on loopback, same client", us("BenchmarkHTTPBaseline")), true))
	}
	f.Notes = append(f.Notes, fmt.Sprintf("From `go test ./internal/mcpproxy -run '^$' -bench . -benchtime 2000x`, run %d times alternately (the test binary, built once, runs every benchmark once per run). The difference column of the request rows is the latency the proxy adds per request. open-50 has no reference: it is the time from 50 initialize requests to 50 running servers.", l.cfg.MCPRuns))
	if len(f.Rows) == 0 {
		return fmt.Errorf("no MCP benchmark results")
	}
	return nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
