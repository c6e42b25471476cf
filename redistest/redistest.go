// Package redistest provides a real Redis to tests, the harness and the
// benchmarks, the way package pgtest provides PostgreSQL. Nothing in
// reservebench is tested against an in-process fake.
//
// A server is found in this order:
//
//  1. RESERVEBENCH_REDIS: the address of any server that speaks the Redis
//     protocol, as a URL ("redis://localhost:6379/0", "unix:///run/r.sock").
//     The tests only add keys under prefixes of their own and never flush;
//     a server they did not start cannot be stopped or killed, so the
//     scenarios that do that are reported as not supported.
//  2. A local redis-server binary (RESERVEBENCH_REDIS_SERVER, PATH,
//     /usr/bin, /usr/local/bin): a throwaway instance in a temp dir, with
//     no TCP port (port 0) and a Unix socket in that dir, started with the
//     settings the strategy needs (e.g. "appendonly yes").
//  3. A redis container through dockertest when a Docker daemon answers
//     (RESERVEBENCH_DOCKER=0 turns this off).
//
// Otherwise Start fails with one message naming the three ways.
//
// A local instance is watched by a guard process that holds a pipe from the
// test process: when the test process exits for any reason (a failed test,
// a panic, SIGKILL) the pipe closes, and the guard kills the instance
// (whatever its current pid after restarts) and removes the temp dir. Close
// does the same synchronously.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Environment variables that steer the package.
const (
	EnvAddr   = "RESERVEBENCH_REDIS"        // use this server instead of starting one
	EnvServer = "RESERVEBENCH_REDIS_SERVER" // the redis-server binary to run
	EnvDocker = "RESERVEBENCH_DOCKER"       // "0" disables the Docker fallback (shared with pgtest)
)

// ErrNoServer is returned by Start when no way to get a server worked.
var ErrNoServer = errors.New("redistest: no Redis available")

// ErrNotSupported is returned by Kill, Stop, Start and Wipe on a server the
// package did not start itself (an address from the environment, a
// container).
var ErrNotSupported = errors.New("redistest: not supported by this kind of server")

// Kind says where a Server came from.
type Kind string

// The kinds of server.
const (
	KindAddr   Kind = "addr"
	KindLocal  Kind = "local"
	KindDocker Kind = "docker"
)

// Server is a running Redis.
type Server struct {
	Kind Kind
	// Version is redis_version from INFO, e.g. "7.0.15".
	Version string

	addr   string
	local  *localServer
	docker *dockerServer
}

// Start finds or starts a server, in the order of the package comment.
// settings are redis.conf lines for a server it starts (e.g.
// "appendonly yes", "appendfsync always"); a server from the environment is
// used as it is.
func Start(ctx context.Context, settings ...string) (*Server, error) {
	if addr := os.Getenv(EnvAddr); addr != "" {
		s := &Server{Kind: KindAddr, addr: addr}
		if err := s.probe(ctx); err != nil {
			return nil, fmt.Errorf("redistest: %s=%q: %w", EnvAddr, addr, err)
		}
		return s, nil
	}
	var reasons []string
	ls, err := startLocal(ctx, settings)
	if err == nil {
		s := &Server{Kind: KindLocal, addr: ls.addr(), local: ls}
		if err := s.probe(ctx); err != nil {
			_ = ls.close()
			return nil, fmt.Errorf("redistest: local redis-server started but does not answer: %w", err)
		}
		return s, nil
	}
	reasons = append(reasons, "local binary: "+err.Error())
	if os.Getenv(EnvDocker) != "0" {
		ds, err := startDocker(ctx, settings)
		if err == nil {
			s := &Server{Kind: KindDocker, addr: ds.addr, docker: ds}
			if err := s.probe(ctx); err != nil {
				ds.stop()
				return nil, fmt.Errorf("redistest: container started but does not answer: %w", err)
			}
			return s, nil
		}
		reasons = append(reasons, "docker: "+err.Error())
	} else {
		reasons = append(reasons, "docker: disabled by "+EnvDocker+"=0")
	}
	return nil, fmt.Errorf("%w. Give one of:\n"+
		"  1. %s=redis://host:port/0 or unix:///path/to/redis.sock (a server the tests may add keys to);\n"+
		"  2. a redis-server binary: on Debian `apt-get install -y redis-server` (make deps does it),\n"+
		"     on macOS `brew install redis`; or point %s at it;\n"+
		"  3. a running Docker daemon (a redis container is started through dockertest).\n"+
		"What was tried:\n  - %s",
		ErrNoServer, EnvAddr, EnvServer, strings.Join(reasons, "\n  - "))
}

// New starts a server for one test (Start with settings) and closes it
// when the test ends; a failure to get one fails the test.
func New(tb testing.TB, settings ...string) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, settings...)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("redistest: %v", err)
		}
	})
	return s
}

// Addr is the server's address as a URL go-redis parses (redis.ParseURL):
// what goes into strategy.Config.Resources.
func (s *Server) Addr() string { return s.addr }

// Client opens a client on the server; the caller closes it.
func (s *Server) Client() (*redis.Client, error) { return Client(s.addr) }

// Client opens a go-redis client on addr (a URL).
func Client(addr string) (*redis.Client, error) {
	opt, err := redis.ParseURL(addr)
	if err != nil {
		return nil, fmt.Errorf("redistest: parse address %q: %w", addr, err)
	}
	return redis.NewClient(opt), nil
}

func (s *Server) probe(ctx context.Context) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			s.Version = v
		}
	}
	return nil
}

// Controllable reports whether Kill, Stop, Start and Wipe work: only on an
// instance the package started from a local binary.
func (s *Server) Controllable() bool { return s.local != nil }

func (s *Server) need(what string) (*localServer, error) {
	if s.local == nil {
		return nil, fmt.Errorf("%w: %s needs a local instance (server kind %s)", ErrNotSupported, what, s.Kind)
	}
	return s.local, nil
}

// Kill sends SIGKILL to the server and waits until it is gone: whatever it
// had not yet written to its files is lost, as in a crash of the process.
func (s *Server) Kill(ctx context.Context) error {
	l, err := s.need("kill")
	if err != nil {
		return err
	}
	quietDialFailures()
	return l.kill(ctx)
}

// Stop shuts the server down gracefully (SIGTERM: it flushes its AOF, and
// writes no snapshot since the instance runs with save "") and waits until
// it is gone.
func (s *Server) Stop(ctx context.Context) error {
	l, err := s.need("stop")
	if err != nil {
		return err
	}
	quietDialFailures()
	return l.stop(ctx)
}

// Restart starts a stopped or killed server again on the same directory,
// configuration and address: it loads whatever its persistence kept.
func (s *Server) Restart(ctx context.Context) error {
	l, err := s.need("restart")
	if err != nil {
		return err
	}
	if err := l.start(ctx); err != nil {
		return err
	}
	return s.probe(ctx)
}

// Wipe removes the data files of a stopped server (AOF and snapshot), so
// that the next Restart starts empty, as a replacement instance would.
func (s *Server) Wipe() error {
	l, err := s.need("wipe")
	if err != nil {
		return err
	}
	return l.wipe()
}

// Running reports whether the process of a local instance is alive.
func (s *Server) Running() bool { return s.local != nil && s.local.running() }

// Close stops a server the package started and removes its files. For an
// address from the environment it does nothing.
func (s *Server) Close() error {
	switch {
	case s.local != nil:
		return s.local.close()
	case s.docker != nil:
		s.docker.stop()
	}
	return nil
}

// Dir is the temp dir of a local instance (config, socket, data, log), or "".
func (s *Server) Dir() string {
	if s.local == nil {
		return ""
	}
	return s.local.dir
}

// PID is the process id of a running local instance, or 0.
func (s *Server) PID() int {
	if s.local == nil || !s.local.running() {
		return 0
	}
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	return s.local.cmd.Process.Pid
}
