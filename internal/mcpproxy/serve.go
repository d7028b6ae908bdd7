package mcpproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/go-hclog"
)

// expireIdle ends sessions idle for longer than SessionIdleTimeout.
func (p *Proxy) expireIdle() {
	p.mu.Lock()
	all := make([]*session, 0, len(p.sessions))
	for _, s := range p.sessions {
		all = append(all, s)
	}
	p.mu.Unlock()
	now := p.now()
	for _, s := range all {
		if since, idle := s.idleSince(); idle && now.Sub(since) >= p.opts.SessionIdleTimeout {
			s.end(fmt.Sprintf("the session was idle for %s and expired", p.opts.SessionIdleTimeout))
		}
	}
}

// Shutdown ends every session (waiting requests get an error, streams
// close) and stops their servers, refusing new sessions from then on. It
// returns when all servers are gone or ctx is done.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.closing = true
	all := make([]*session, 0, len(p.sessions))
	for _, s := range p.sessions {
		all = append(all, s)
	}
	p.mu.Unlock()
	for _, s := range all {
		s.end(errShuttingDown.Error())
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stopping MCP servers: %w", ctx.Err())
	}
}

// Run listens on opts.Addr and serves until ctx is cancelled, then shuts
// down gracefully within opts.ShutdownTimeout.
func Run(ctx context.Context, opts Options) error {
	p, err := New(opts)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", opts.Addr)
	if err != nil {
		return fmt.Errorf("listening for MCP clients: %w (hint: is another agent-mcp running? choose another --listen address)", err)
	}
	return p.Serve(ctx, ln)
}

// Serve serves on ln until ctx is cancelled, then stops accepting, ends the
// sessions, stops the servers and returns, within ShutdownTimeout.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           p.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          p.log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
	}
	p.log.Info("serving MCP", "addr", ln.Addr().String(), "servers", len(p.servers))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	tick := time.NewTicker(min(p.opts.SessionIdleTimeout/4, time.Minute))
	defer tick.Stop()
	var serveErr error
loop:
	for {
		select {
		case <-tick.C:
			p.expireIdle()
		case serveErr = <-errc:
			break loop
		case <-ctx.Done():
			break loop
		}
	}

	p.log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), p.opts.ShutdownTimeout)
	defer cancel()
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Shutdown(sctx) }() // stop accepting; wait for handlers
	errs := []error{p.Shutdown(sctx)}              // ending sessions lets stream handlers return
	if err := <-httpDone; err != nil {
		srv.Close()
		errs = append(errs, fmt.Errorf("closing client connections: %w", err))
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		errs = append(errs, fmt.Errorf("serving MCP clients: %w", serveErr))
	}
	return errors.Join(errs...)
}
