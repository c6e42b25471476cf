// Package pgtest provides a real PostgreSQL to tests, the harness and the
// benchmarks. No part of reservebench is tested against a mock database.
//
// A server is found in this order:
//
//  1. RESERVEBENCH_DSN: any server that speaks the PostgreSQL protocol, e.g.
//     "postgres://postgres@localhost:5432/postgres?sslmode=disable". The role
//     must be able to create databases; pgtest creates its own and drops them.
//  2. Local binaries (initdb, pg_ctl, postgres) from RESERVEBENCH_PG_BINDIR,
//     `pg_config --bindir`, PATH, /usr/lib/postgresql/*/bin or Homebrew: a
//     throwaway cluster in a temp dir, reached over a Unix socket in that dir
//     (in /dev/shm for a cluster without fsync, see clusterRoot). As root (CI), initdb and the server run as the `postgres` user, because
//     PostgreSQL refuses to run as root.
//  3. A postgres container through dockertest when a Docker daemon answers.
//
// Otherwise Start fails with one message naming the three ways.
//
// A local cluster is watched by a small guard process that holds a pipe from
// the test process: when the test process exits for any reason (a failed test,
// a panic, a SIGKILL) the pipe closes and the guard stops the server and
// removes the temp dir. Normal shutdown (Stop) does the same synchronously.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables that steer the helper.
const (
	EnvDSN    = "RESERVEBENCH_DSN"       // use this server instead of starting one
	EnvBinDir = "RESERVEBENCH_PG_BINDIR" // look for initdb/pg_ctl/postgres here first
	EnvDocker = "RESERVEBENCH_DOCKER"    // "0" disables the Docker fallback
	EnvOnDisk = "RESERVEBENCH_PG_ONDISK" // set: a cluster without fsync stays on disk too (clusterRoot)
)

// ErrNoServer is returned by Start when no way to get a server worked.
var ErrNoServer = errors.New("pgtest: no PostgreSQL available")

// ErrNotSupported is returned by Crash and Restart on servers pgtest did not
// start itself (a user's DSN or a container).
var ErrNotSupported = errors.New("pgtest: not supported by this kind of server")

// Kind says where a Server came from.
type Kind string

// The kinds of server.
const (
	KindDSN    Kind = "dsn"
	KindLocal  Kind = "local"
	KindDocker Kind = "docker"
)

// Options tune a server pgtest starts itself. The zero value is what tests use.
type Options struct {
	// Fsync keeps fsync on. Tests run with fsync off, which changes nothing
	// about transactions or crash recovery as long as the machine itself does
	// not crash (an immediate shutdown still recovers every acknowledged
	// commit from WAL); benchmarks turn it on to measure what users would get.
	Fsync bool
	// MaxConnections defaults to 300: 150 clients, the harness, pgbench, and
	// room for parallel tests.
	MaxConnections int
	// Settings are extra postgresql.conf lines, e.g. "log_lock_waits = on".
	Settings []string
	// ClockAhead runs the server's clock this far ahead of the machine's
	// (libfaketime preloaded into every server process). libfaketime also
	// moves the timers PostgreSQL arms for its timeouts by the offset:
	// statement_timeout, lock_timeout and deadlock_timeout fire that much
	// late (TestClockAheadServer), so only work that waits on none of them
	// belongs on such a server. Only a local cluster can do it: Start then
	// tries neither RESERVEBENCH_DSN nor Docker, and fails with
	// ErrNoFaketime when the library is missing.
	ClockAhead time.Duration
}

// Server is a running PostgreSQL.
type Server struct {
	Kind Kind
	// Version is server_version, e.g. "15.18 (Debian 15.18-0+deb12u1)".
	Version string

	adminDSN string // superuser (or the user's role), database "postgres" or the DSN's
	local    *localCluster
	docker   *dockerServer

	mu       sync.Mutex
	appRole  string // created once per server, "" if the server forbids it
	roleDone bool
}

// Start finds or starts a server, in the order of the package comment.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.ClockAhead != 0 {
		return startClockAhead(ctx, opts)
	}
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		s := &Server{Kind: KindDSN, adminDSN: dsn}
		if err := s.probe(ctx); err != nil {
			return nil, fmt.Errorf("pgtest: %s=%q: %w", EnvDSN, redact(dsn), err)
		}
		return s, nil
	}
	var reasons []string
	lc, err := startLocal(ctx, opts)
	if err == nil {
		s := &Server{Kind: KindLocal, adminDSN: lc.dsn("postgres"), local: lc}
		if err := s.probe(ctx); err != nil {
			_ = lc.stop()
			return nil, fmt.Errorf("pgtest: local cluster started but does not answer: %w", err)
		}
		return s, nil
	}
	reasons = append(reasons, "local binaries: "+err.Error())
	if os.Getenv(EnvDocker) != "0" {
		ds, err := startDocker(ctx, opts)
		if err == nil {
			s := &Server{Kind: KindDocker, adminDSN: ds.dsn, docker: ds}
			if err := s.probe(ctx); err != nil {
				ds.stop()
				return nil, fmt.Errorf("pgtest: container started but does not answer: %w", err)
			}
			return s, nil
		}
		reasons = append(reasons, "docker: "+err.Error())
	} else {
		reasons = append(reasons, "docker: disabled by "+EnvDocker+"=0")
	}
	return nil, fmt.Errorf("%w. Give one of:\n"+
		"  1. %s=postgres://user@host:port/db (a server where that role may CREATE DATABASE);\n"+
		"  2. PostgreSQL binaries (initdb, pg_ctl, postgres): on Debian `apt-get install -y postgresql`,\n"+
		"     on macOS `brew install postgresql`; or point %s at their directory;\n"+
		"  3. a running Docker daemon (a postgres container is started through dockertest).\n"+
		"What was tried:\n  - %s",
		ErrNoServer, EnvDSN, EnvBinDir, strings.Join(reasons, "\n  - "))
}

func (s *Server) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.admin())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, "SHOW server_version").Scan(&s.Version)
}

// Stop stops a server pgtest started and removes its files. For a DSN server
// it does nothing.
func (s *Server) Stop() error {
	switch local := s.cluster(); {
	case local != nil:
		return local.stop()
	case s.docker != nil:
		s.docker.stop()
	}
	return nil
}

// AdminDSN is the DSN of the superuser (or the DSN the user gave) for a
// database on this server.
func (s *Server) AdminDSN(database string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return withDatabase(s.adminDSN, database)
}

// admin is the admin DSN as it is now (a promoted standby's after a failover).
func (s *Server) admin() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.adminDSN
}

// cluster is the local cluster the server is now (a promoted standby after
// a failover), or nil.
func (s *Server) cluster() *localCluster {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.local
}

// Crash stops the server the way a power cut would stop the process:
// `pg_ctl stop -m immediate`, no checkpoint; the next start runs crash
// recovery from WAL. It returns once the postmaster process has ended, not
// only its pid file. Only for local clusters.
func (s *Server) Crash(ctx context.Context) error {
	local := s.cluster()
	if local == nil {
		return fmt.Errorf("%w: crash needs a local cluster (server kind %s)", ErrNotSupported, s.Kind)
	}
	pid := local.postmasterPID()
	if err := local.pgctl(ctx, "stop", "-m", "immediate", "-w"); err != nil {
		return err
	}
	return waitExited(ctx, pid)
}

// Restart starts a crashed or stopped local cluster again on the same data.
func (s *Server) Restart(ctx context.Context) error {
	local := s.cluster()
	if local == nil {
		return fmt.Errorf("%w: restart needs a local cluster (server kind %s)", ErrNotSupported, s.Kind)
	}
	if err := local.start(ctx); err != nil {
		return err
	}
	return s.probe(ctx)
}

// DataDir is the data directory of a local cluster, or "".
func (s *Server) DataDir() string {
	local := s.cluster()
	if local == nil {
		return ""
	}
	return local.dataDir()
}

// Dir is the temp dir holding a local cluster (data, socket, logs), or "".
func (s *Server) Dir() string {
	local := s.cluster()
	if local == nil {
		return ""
	}
	return local.dir
}

// BinDir is where the local cluster's binaries are (pgbench is usually there too), or "".
func (s *Server) BinDir() string {
	local := s.cluster()
	if local == nil {
		return ""
	}
	return local.bin
}

// PID is the postmaster's process id of a local cluster, or 0.
func (s *Server) PID() int {
	local := s.cluster()
	if local == nil {
		return 0
	}
	return local.postmasterPID()
}

// shared is the server of this test process, started on first use.
var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// SharedMaxConnections is the shared server's max_connections: every test
// of a binary uses it at once, and table 28-1 has every strategy under way
// together, each keeping its pools warm between its scenarios.
const SharedMaxConnections = 1000

// Shared returns this process's server, starting it on first use. It is
// stopped by Main after the tests, or by the guard when the process exits.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared.srv, shared.err = Start(ctx, Options{MaxConnections: SharedMaxConnections})
	})
	if shared.err != nil {
		tb.Fatalf("%v", shared.err)
	}
	return shared.srv
}

// ClockAhead is how far ahead of the machine's clock the server of
// ClockAheadServer keeps its own: far more than the time a request takes,
// so that a strategy that mixes the two clocks is seconds off.
const ClockAhead = 5 * time.Second

// clockAhead is the process's server whose clock runs ClockAhead ahead,
// started on first use and stopped with the shared server.
var clockAhead struct {
	once sync.Once
	srv  *Server
	err  error
}

// ClockAheadServer returns this process's server whose clock runs
// ClockAhead ahead of the machine's, starting it on first use. It is
// stopped by Main after the tests, or by the guard when the process exits.
func ClockAheadServer(ctx context.Context) (*Server, error) {
	clockAhead.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		clockAhead.srv, clockAhead.err = Start(ctx, Options{ClockAhead: ClockAhead})
	})
	return clockAhead.srv, clockAhead.err
}

// EnvHelper names the helper-process entry point a test binary re-executed by
// a test should run instead of its tests (the os/exec test pattern).
const EnvHelper = "RESERVEBENCH_HELPER"

var helpers = map[string]func() int{}

// RegisterHelper registers a helper-process entry point, from an init
// function. When a test binary whose TestMain calls Main is started with
// RESERVEBENCH_HELPER=name, Main runs fn instead of the tests and exits with
// its code. Fault scenarios use it to run a client in a process they can
// SIGKILL.
func RegisterHelper(name string, fn func() int) {
	if _, dup := helpers[name]; dup {
		panic("pgtest: helper registered twice: " + name)
	}
	helpers[name] = fn
}

// Main runs the tests of a package and stops the shared server afterwards:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Without it the guard process still stops the server when the test binary
// exits, a moment later. When RESERVEBENCH_HELPER names a registered helper,
// Main runs that instead of the tests.
func Main(m *testing.M) {
	if name := os.Getenv(EnvHelper); name != "" {
		fn, ok := helpers[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "pgtest: %s=%q: no such helper in this test binary\n", EnvHelper, name)
			os.Exit(3)
		}
		os.Exit(fn())
	}
	code := m.Run()
	if clockAhead.srv != nil {
		if err := clockAhead.srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	if shared.srv != nil {
		if err := shared.srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

func redact(dsn string) string {
	if i := strings.Index(dsn, "password="); i >= 0 {
		return dsn[:i] + "password=***"
	}
	if cfg, err := pgx.ParseConfig(dsn); err == nil && cfg.Password != "" {
		return strings.Replace(dsn, cfg.Password, "***", 1)
	}
	return dsn
}

// withDatabase returns dsn pointed at another database. pgx accepts a
// keyword/value string where a later keyword overrides an earlier one, but a
// URL must be rewritten.
func withDatabase(dsn, database string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return replaceURLPath(dsn, database)
	}
	if loc := dbnameSetting.FindStringSubmatchIndex(dsn); loc != nil {
		// Replace, not append: libpq's last setting would win too, but a DSN
		// printed for a user to paste (reservebench serve) should name one.
		return dsn[:loc[2]] + "dbname=" + database + dsn[loc[1]:]
	}
	return dsn + " dbname=" + database
}

// dbnameSetting is a keyword/value DSN's dbname, its value bare or quoted.
var dbnameSetting = regexp.MustCompile(`(?:^|\s)(dbname\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S+))`)

func replaceURLPath(dsn, database string) string {
	schemeEnd := strings.Index(dsn, "://") + 3
	rest := dsn[schemeEnd:]
	query := ""
	if q := strings.IndexByte(rest, '?'); q >= 0 {
		query, rest = rest[q:], rest[:q]
	}
	if slash := strings.IndexByte(rest, '/'); slash >= 0 {
		rest = rest[:slash]
	}
	return dsn[:schemeEnd] + rest + "/" + database + query
}
