package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// AppRole is the non-superuser role strategies run as. Seed 004 runs its
// service as such a role: it may connect, create and use its own tables in
// schema public, and nothing else (no superuser, no CREATEDB, no CREATEROLE).
const AppRole = "reservebench_app"

// Database is a fresh database on a server, for one test or one run.
type Database struct {
	Server *Server
	Name   string
	// DSN connects as AppRole when the server allowed creating it, else as
	// the admin role.
	DSN string
	// AdminDSN connects as the superuser (or the user's role): for the
	// harness's own probes (pg_locks, pg_stat_activity) and for pgbench.
	AdminDSN string
	// AsAppRole reports whether DSN uses AppRole.
	AsAppRole bool
}

// TimeZone is the TimeZone setting of every database CreateDatabase
// creates: not UTC, and not a whole number of hours from it, so that a
// strategy that stores expires_at as a timestamp without time zone (a wall
// clock reading in the session's zone, read back as if it were UTC), or
// that formats or parses a time in the server's zone, is off by 5 h 45 min
// and fails the expiry checks. A server in UTC, as CI machines and
// containers usually are, hides that mistake.
const TimeZone = "Asia/Kathmandu"

// CreateDatabase creates a new, uniquely named database, in TimeZone, and
// grants AppRole what strategies need in it.
func (s *Server) CreateDatabase(ctx context.Context, prefix string) (*Database, error) {
	// PostgreSQL cuts a name at 63 bytes, and the suffix, which makes it
	// unique, is at its end: the prefix gives way.
	const maxPrefix = 63 - 1 - 12
	if len(prefix) > maxPrefix {
		prefix = prefix[:maxPrefix]
	}
	name := prefix + "_" + randomSuffix()
	admin, err := pgx.Connect(ctx, s.admin())
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect admin: %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET timezone = '"+TimeZone+"'"); err != nil {
		_ = s.DropDatabase(ctx, name)
		return nil, fmt.Errorf("pgtest: time zone of database %s: %w", name, err)
	}
	db := &Database{Server: s, Name: name, AdminDSN: s.AdminDSN(name), DSN: s.AdminDSN(name)}
	role, err := s.ensureAppRole(ctx, admin)
	if err != nil {
		_ = s.DropDatabase(ctx, name)
		return nil, err
	}
	if role != "" {
		if err := grantApp(ctx, db.AdminDSN, name, role); err != nil {
			_ = s.DropDatabase(ctx, name)
			return nil, err
		}
		appDSN := withUser(db.AdminDSN, role)
		conn, err := pgx.Connect(ctx, appDSN)
		switch {
		case err == nil:
			_ = conn.Close(ctx)
			db.DSN, db.AsAppRole = appDSN, true
		case s.Kind != KindDSN:
			_ = s.DropDatabase(ctx, name)
			return nil, fmt.Errorf("pgtest: connect as %s: %w", role, err)
		default:
			// A user's server whose authentication does not let the
			// passwordless role in: run as the given role.
		}
	}
	return db, nil
}

// ensureAppRole creates AppRole once per server. A server that refuses
// (a user's DSN without CREATEROLE) is used with its own role throughout.
func (s *Server) ensureAppRole(ctx context.Context, admin *pgx.Conn) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.roleDone {
		return s.appRole, nil
	}
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", AppRole).Scan(&exists); err != nil {
		return "", fmt.Errorf("pgtest: look up role: %w", err)
	}
	if !exists {
		_, err := admin.Exec(ctx, "CREATE ROLE "+AppRole+" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION")
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
		case errors.As(err, &pgErr) && (pgErr.Code == "42710" || pgErr.Code == "23505"):
			// created meanwhile by a test process sharing the server
		case errors.As(err, &pgErr) && pgErr.Code == "42501" && s.Kind == KindDSN:
			s.roleDone = true // no CREATEROLE: run as the given role
			return "", nil
		default:
			return "", fmt.Errorf("pgtest: create role %s: %w", AppRole, err)
		}
	}
	s.appRole, s.roleDone = AppRole, true
	return s.appRole, nil
}

func grantApp(ctx context.Context, adminDSN, database, role string) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("pgtest: connect %s: %w", database, err)
	}
	defer conn.Close(ctx)
	db, r := pgx.Identifier{database}.Sanitize(), pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		"GRANT CONNECT, TEMPORARY ON DATABASE " + db + " TO " + r,
		"GRANT USAGE, CREATE ON SCHEMA public TO " + r,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("pgtest: %s: %w", stmt, err)
		}
	}
	return nil
}

// DropDatabase drops a database, disconnecting whoever is still in it.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	admin, err := pgx.Connect(ctx, s.admin())
	if err != nil {
		return fmt.Errorf("pgtest: connect admin: %w", err)
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	if err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

// NewDatabase creates a database on the shared server for one test and drops
// it when the test ends.
func NewDatabase(tb testing.TB) *Database {
	tb.Helper()
	return NewDatabaseOn(tb, Shared(tb))
}

// NewDatabaseOn is NewDatabase on a given server.
func NewDatabaseOn(tb testing.TB, s *Server) *Database {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := s.CreateDatabase(ctx, "rb_"+sanitize(tb.Name()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.DropDatabase(ctx, db.Name); err != nil {
			tb.Errorf("%v", err)
		}
	})
	return db
}

// Pool opens a pool to the database as the application role, closed when
// the test ends. maxConns bounds the connections (0: 32).
func (d *Database) Pool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	return openPool(tb, d.DSN, maxConns)
}

// AdminPool opens a superuser pool to the database, closed when the test ends.
func (d *Database) AdminPool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	return openPool(tb, d.AdminDSN, maxConns)
}

// DB is the shortest way to a real database: a fresh one on the shared
// server, as the application role, with a pool of at most 32 connections.
func DB(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return NewDatabase(tb).Pool(tb, 0)
}

// OpenPool opens a pool on dsn with at most maxConns connections (0: 32).
// Its queries are traced for the timeouts they set (LongestTimeoutSet).
// A connection idle for IdleClose is closed: a harness runs dozens of
// strategies at once, each with pools kept warm between its scenarios, and
// the idle connections of those waiting for their next turn would fill the
// server's max_connections.
func OpenPool(ctx context.Context, dsn string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgtest: parse dsn: %w", err)
	}
	if maxConns <= 0 {
		maxConns = 32
	}
	cfg.MaxConns = maxConns
	cfg.MaxConnIdleTime = IdleClose
	cfg.HealthCheckPeriod = IdleClose / 4
	tr := &timeoutTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgtest: open pool: %w", err)
	}
	tracers.Store(pool, tr)
	return pool, nil
}

// IdleClose is how long a connection of an OpenPool pool stays open idle.
const IdleClose = 30 * time.Second

func openPool(tb testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := OpenPool(ctx, dsn, maxConns)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		// The leak is the verdict of the check that met it (strategytest's
		// checkPoolReturned); here it must only not hang the test.
		if err := CloseWithin(pool, 10*time.Second); err != nil {
			tb.Log(err)
		}
	})
	return pool
}

func withUser(dsn, role string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		schemeEnd := strings.Index(dsn, "://") + 3
		rest := dsn[schemeEnd:]
		if at := strings.IndexByte(rest, '@'); at >= 0 {
			rest = rest[at+1:]
		}
		return dsn[:schemeEnd] + role + "@" + rest
	}
	return dsn + " user=" + role
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sanitize turns a test name into a short lower-case identifier part.
func sanitize(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() >= 30 {
			break
		}
	}
	return b.String()
}

// Pools gives a test a fresh database: db as the application role (at most 32
// connections) for the strategy, admin as the superuser (at most 4) for lock
// probes. It has the signature of strategytest.NewDB.
func Pools(tb testing.TB) (db, admin *pgxpool.Pool) {
	tb.Helper()
	d := NewDatabase(tb)
	return d.Pool(tb, 32), d.AdminPool(tb, 4)
}

// CloseWithin closes p, waiting at most d for the connections still
// acquired to come back (pgxpool.Pool.Close waits for them for ever). A
// pool whose connections do not come back, which a strategy that leaks
// one on an error path leaves, is left to the process's end and named in
// the error: one leak must fail a test, not hang it.
func CloseWithin(p *pgxpool.Pool, d time.Duration) error {
	done := make(chan struct{})
	go func() {
		p.Close()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("pgtest: %d connections of the pool were still acquired %v after it was closed (a connection taken and never released)", p.Stat().AcquiredConns(), d)
	}
}
