package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Standby is a streaming replica of a local cluster: a copy taken with
// pg_basebackup, started in recovery and streaming WAL from the primary. It
// lives in a temp dir of its own, watched by a guard process of its own
// like every cluster pgtest starts, so it never outlives the test process.
type Standby struct {
	// Name is its application_name on the primary (pg_stat_replication),
	// what synchronous_standby_names names to make it synchronous.
	Name    string
	primary *Server
	local   *localCluster
	adopted bool
}

// StartStandby takes a base backup of the server (a local cluster, else
// ErrNotSupported), starts it as a hot standby streaming from the server
// under the application_name name, and waits until the primary shows it
// streaming in pg_stat_replication.
func (s *Server) StartStandby(ctx context.Context, name string) (_ *Standby, err error) {
	s.mu.Lock()
	primary := s.local
	s.mu.Unlock()
	if primary == nil {
		return nil, fmt.Errorf("%w: a standby needs a local cluster (server kind %s)", ErrNotSupported, s.Kind)
	}
	dir, err := os.MkdirTemp(filepath.Dir(primary.dir), "pgtest-standby-") // beside the primary: on the same file system
	if err != nil {
		return nil, err
	}
	c := &localCluster{bin: primary.bin, dir: dir, cred: primary.cred}
	if err := c.startGuard(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = c.stop()
		}
	}()
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return nil, err
		}
	}
	if err := c.run(ctx, filepath.Join(c.bin, "pg_basebackup"), "-D", c.dataDir(), "-h", primary.dir,
		"-p", fmt.Sprint(socketPort), "-U", "postgres", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return nil, fmt.Errorf("pg_basebackup: %w", err)
	}
	// The copy carries the primary's configuration, postgresql.auto.conf
	// (ALTER SYSTEM) included, which is read last: the standby's own
	// settings go at its end, where they win.
	conf := []string{
		"# standby, written by reservebench/pgtest",
		fmt.Sprintf("unix_socket_directories = '%s'", c.dir),
		fmt.Sprintf("primary_conninfo = 'host=%s port=%d user=postgres application_name=%s'", primary.dir, socketPort, name),
		"hot_standby = on",
	}
	if err := appendFile(filepath.Join(c.dataDir(), "postgresql.auto.conf"), "\n"+strings.Join(conf, "\n")+"\n"); err != nil {
		return nil, err
	}
	if err := appendFile(filepath.Join(c.dataDir(), "standby.signal"), ""); err != nil {
		return nil, err
	}
	if c.cred != nil {
		for _, f := range []string{"postgresql.auto.conf", "standby.signal"} {
			if err := os.Chown(filepath.Join(c.dataDir(), f), int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	sb := &Standby{Name: name, primary: s, local: c}
	if err := sb.waitStreaming(ctx, true); err != nil {
		return nil, err
	}
	return sb, nil
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(text)
	if err := f.Close(); werr == nil {
		werr = err
	}
	return werr
}

// Dir is the standby's temp dir, which holds its Unix socket: the host of
// a DSN that reaches it.
func (sb *Standby) Dir() string { return sb.local.dir }

// DSN is the DSN of the standby's superuser for a database.
func (sb *Standby) DSN(database string) string { return sb.local.dsn(database) }

// PID is the standby's postmaster process id, or 0.
func (sb *Standby) PID() int { return sb.local.postmasterPID() }

// StopReceiving makes the standby stop streaming (primary_conninfo
// emptied and reloaded) and waits until the primary's pg_stat_replication
// no longer lists it: from then on it falls behind by every commit, as a
// standby does whose network to the primary is down. With the standby
// named in synchronous_standby_names, commits on the primary wait.
func (sb *Standby) StopReceiving(ctx context.Context) error {
	if err := sb.exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	return sb.waitStreaming(ctx, false)
}

func (sb *Standby) exec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, sb.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: standby: connect: %w", err)
	}
	defer conn.Close(ctx)
	for _, stmt := range stmts {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("pgtest: standby: %s: %w", stmt, err)
		}
	}
	return nil
}

// waitStreaming polls the primary's pg_stat_replication until the standby
// is listed streaming (want) or not listed at all (!want), for at most a
// minute. Polling here observes the server; it orders nothing.
func (sb *Standby) waitStreaming(ctx context.Context, want bool) error {
	conn, err := pgx.Connect(ctx, sb.primary.AdminDSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: standby: connect to the primary: %w", err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND ($2 OR state = 'streaming')`,
			sb.Name, !want).Scan(&n); err != nil {
			return fmt.Errorf("pgtest: standby: pg_stat_replication: %w", err)
		}
		if (n > 0) == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: standby %s: streaming=%v not seen within a minute", sb.Name, want)
		}
		time.Sleep(10 * time.Millisecond) // paces the question; the answer decides
	}
}

// Promote ends the standby's recovery (pg_ctl promote, waiting until it
// accepts writes) and makes it the server: from then on the Server's DSNs,
// Crash, Restart, Dir and PID are the promoted standby's, and the old
// primary's files are removed (its postmaster must be stopped already: a
// failover follows a dead primary). Nothing else may use the Server
// meanwhile.
func (sb *Standby) Promote(ctx context.Context) error {
	if err := sb.local.pgctl(ctx, "promote", "-w", "-t", "60"); err != nil {
		return fmt.Errorf("pgtest: promote %s: %w", sb.Name, err)
	}
	s := sb.primary
	s.mu.Lock()
	old := s.local
	s.local, s.adminDSN = sb.local, sb.local.dsn("postgres")
	sb.adopted = true
	s.mu.Unlock()
	if old != nil {
		return old.stop()
	}
	return nil
}

// Stop stops a standby that was not promoted and removes its files; after
// Promote it does nothing (the Server owns it then).
func (sb *Standby) Stop() error {
	if sb.adopted {
		return nil
	}
	return sb.local.stop()
}
