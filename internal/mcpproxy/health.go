package mcpproxy

import (
	"encoding/json"
	"net/http"
	"sort"
)

// HealthReport is what the health endpoint answers. It names no commands,
// arguments or environment: those may hold secrets.
type HealthReport struct {
	// Status is "ok" when the proxy can serve (it has no servers, or at
	// least one can start) and "unavailable" when none of its servers can.
	Status  string         `json:"status"`
	Servers []ServerHealth `json:"servers"`
}

// ServerHealth reports one server.
type ServerHealth struct {
	Name     string `json:"name"`
	CanStart bool   `json:"canStart"`
	Problem  string `json:"problem,omitempty"` // why it cannot start
	Sessions int    `json:"sessions"`          // open client sessions
}

// Health checks every server's command now (PATH may have changed since the
// proxy started).
func (p *Proxy) Health() HealthReport {
	counts := p.sessionCounts()
	rep := HealthReport{Status: "ok", Servers: []ServerHealth{}}
	startable := 0
	for _, e := range p.servers {
		h := ServerHealth{Name: e.Name, CanStart: true, Sessions: counts[e.Name]}
		if _, err := resolveCommand(e.Server); err != nil {
			h.CanStart, h.Problem = false, err.Error()
		} else {
			startable++
		}
		rep.Servers = append(rep.Servers, h)
	}
	sort.Slice(rep.Servers, func(i, j int) bool { return rep.Servers[i].Name < rep.Servers[j].Name })
	if len(p.servers) > 0 && startable == 0 {
		rep.Status = "unavailable"
	}
	return rep
}

func (p *Proxy) serveHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		httpError(w, http.StatusMethodNotAllowed, "method not allowed: GET the health report")
		return
	}
	rep := p.Health()
	status := http.StatusOK
	if rep.Status != "ok" {
		status = http.StatusServiceUnavailable
	}
	body, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method == http.MethodGet {
		_, _ = w.Write(append(body, '\n'))
	}
}
