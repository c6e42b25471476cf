package pgtest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestDatabaseRunsAsNonSuperuser(t *testing.T) {
	db := pgtest.NewDatabase(t)
	pool := db.Pool(t, 4)
	ctx := context.Background()

	var super bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super))
	if db.AsAppRole {
		require.False(t, super, "strategies must run as a role without superuser")
	}
	_, err := pool.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
	require.NoError(t, err, "the application role may create and use its own tables")

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	require.Equal(t, 1, n)

	if db.AsAppRole {
		_, err = pool.Exec(ctx, "CREATE DATABASE should_fail")
		require.Error(t, err, "the application role must not create databases")
	}
}

func TestDatabasesAreIsolated(t *testing.T) {
	ctx := context.Background()
	a, b := pgtest.DB(t), pgtest.DB(t)
	_, err := a.Exec(ctx, "CREATE TABLE only_in_a (x int)")
	require.NoError(t, err)
	_, err = b.Exec(ctx, "SELECT * FROM only_in_a")
	require.Error(t, err)
}

// TestCrashAndRestart crashes a private cluster with pg_ctl stop -m immediate
// and checks that a committed row survives crash recovery.
func TestCrashAndRestart(t *testing.T) {
	if os.Getenv(pgtest.EnvDSN) != "" {
		t.Skipf("crash needs a cluster started by pgtest; %s is set", pgtest.EnvDSN)
	}
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Stop()) })
	if srv.Kind != pgtest.KindLocal {
		t.Skipf("crash needs a local cluster, got %s", srv.Kind)
	}

	db, err := srv.CreateDatabase(ctx, "crash")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, db.DSN)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE t (id int); INSERT INTO t VALUES (42)")
	require.NoError(t, err)
	pidBefore := srv.PID()
	require.NotZero(t, pidBefore)

	require.NoError(t, srv.Crash(ctx))
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the session must be gone after an immediate shutdown")
	require.False(t, processAlive(pidBefore), "postmaster %d still alive after crash", pidBefore)

	require.NoError(t, srv.Restart(ctx))
	conn2, err := pgx.Connect(ctx, db.DSN)
	require.NoError(t, err)
	defer conn2.Close(ctx)
	var id int
	require.NoError(t, conn2.QueryRow(ctx, "SELECT id FROM t").Scan(&id))
	require.Equal(t, 42, id)
}

// TestNothingLeftBehind starts clusters, each with a streaming standby, in
// helper processes (the os/exec test pattern: the test binary re-executed)
// running in parallel, ends them in the three ways a test process ends —
// normally, by a panic, by SIGKILL — and checks that no server process and
// no temp dir outlive them, the standby's included.
func TestNothingLeftBehind(t *testing.T) {
	if os.Getenv(pgtest.EnvDSN) != "" {
		t.Skipf("nothing to clean up when %s is set", pgtest.EnvDSN)
	}
	if testing.Short() {
		t.Skip("starts three clusters")
	}
	var wg sync.WaitGroup
	for _, mode := range []string{"exit", "panic", "sigkill"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			clusters, err := runHelper(mode)
			if err != nil {
				t.Errorf("%s: %v", mode, err)
				return
			}
			for dir, pid := range clusters {
				if err := waitGone(dir, pid, time.Minute); err != nil {
					t.Errorf("%s: %v", mode, err)
				}
			}
		}()
	}
	wg.Wait()
}

// runHelper starts the helper process, reads the dir and PID of its cluster
// and its standby, and ends it the way mode says.
func runHelper(mode string) (clusters map[string]int, err error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "PGTEST_HELPER="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr // a panicking helper is expected to print its panic
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	clusters = map[string]int{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "CLUSTER "); ok {
			f := strings.Fields(rest)
			pid, _ := strconv.Atoi(f[1])
			clusters[f[0]] = pid
			if len(clusters) == 2 {
				break
			}
		}
	}
	if len(clusters) != 2 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("helper reported %d of its 2 clusters: %s", len(clusters), stderr.String())
	}
	for dir, pid := range clusters {
		if !processAlive(pid) {
			return nil, fmt.Errorf("postmaster %d of %s not running while the helper lives", pid, dir)
		}
	}
	if mode == "sigkill" {
		_ = cmd.Process.Signal(syscall.SIGKILL)
	}
	go func() { _, _ = bufio.NewReader(out).WriteTo(devNull{}) }()
	werr := cmd.Wait()
	switch mode {
	case "exit":
		if werr != nil {
			return nil, fmt.Errorf("helper: %v\n%s", werr, stderr.String())
		}
	default:
		if werr == nil {
			return nil, fmt.Errorf("helper in mode %s exited cleanly", mode)
		}
	}
	return clusters, nil
}

// waitGone polls until the guard has stopped the server and removed its dir.
// Polling here waits for cleanup after a process is gone; it synchronises
// nothing between sessions.
func waitGone(dir string, pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		_, statErr := os.Stat(dir)
		if errors.Is(statErr, os.ErrNotExist) && !processAlive(pid) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("after %v: dir %s exists=%v, postmaster %d alive=%v", limit, dir, exists(dir), pid, processAlive(pid))
}

func TestHelperProcess(t *testing.T) {
	mode := os.Getenv("PGTEST_HELPER")
	if mode == "" {
		t.Skip("helper process for TestNothingLeftBehind")
	}
	srv, err := pgtest.Start(context.Background(), pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("CLUSTER %s %d\n", srv.Dir(), srv.PID())
	sb, err := srv.StartStandby(context.Background(), "rb_helper_standby")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("CLUSTER %s %d\n", sb.Dir(), sb.PID())
	switch mode {
	case "exit":
		os.Exit(0) // no Stop: the guard must clean up
	case "panic":
		panic("helper panics with a running cluster")
	case "sigkill":
		select {} // the parent kills us
	}
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	if err == nil {
		// A zombie is dead for our purposes; it only waits to be reaped.
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
			return false
		}
		return true
	}
	return errors.Is(err, syscall.EPERM)
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

type devNull struct{}

func (devNull) Write(p []byte) (int, error) { return len(p), nil }

// TestLeastPrivilegeRoles: the owner role may create in schema public, the
// runtime role may not, not even a temporary table, and may use what the
// owner grants it.
func TestLeastPrivilegeRoles(t *testing.T) {
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	roles, err := pgtest.LeastPrivilege(ctx, db.AdminDSN)
	if errors.Is(err, pgtest.ErrNotSupported) {
		t.Skipf("least privilege: %v", err)
	}
	require.NoError(t, err)
	owner, err := pgx.Connect(ctx, roles.OwnerDSN)
	require.NoError(t, err)
	defer owner.Close(ctx)
	_, err = owner.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY); GRANT SELECT, INSERT ON t TO "+roles.Runtime)
	require.NoError(t, err)
	runtime, err := pgx.Connect(ctx, roles.RuntimeDSN)
	require.NoError(t, err)
	defer runtime.Close(ctx)
	_, err = runtime.Exec(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err, "the runtime role uses what it was granted")
	for _, stmt := range []string{"CREATE TABLE u (x int)", "CREATE TEMP TABLE v (x int)", "DROP TABLE t", "TRUNCATE t", "DELETE FROM t"} {
		_, err := runtime.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as %s: %v, want SQLSTATE 42501", stmt, roles.Runtime, err)
		}
	}
}

// TestStandbyFailover: what the primary committed while the standby
// streamed survives a failover; what it committed after the standby stopped
// receiving (asynchronous replication) is lost; the promoted standby is the
// server from then on, and the old primary's files are gone.
func TestStandbyFailover(t *testing.T) {
	if os.Getenv(pgtest.EnvDSN) != "" {
		t.Skipf("a standby needs a cluster started by pgtest; %s is set", pgtest.EnvDSN)
	}
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Stop()) })
	if srv.Kind != pgtest.KindLocal {
		t.Skipf("a standby needs a local cluster, got %s", srv.Kind)
	}
	conn, err := pgx.Connect(ctx, srv.AdminDSN("postgres"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE t (id int); INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	sb, err := srv.StartStandby(ctx, "rb_test_standby")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sb.Stop()) })
	var lsn string
	_, err = conn.Exec(ctx, "INSERT INTO t VALUES (2)")
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&lsn))
	standby, err := pgx.Connect(ctx, sb.DSN("postgres"))
	require.NoError(t, err)
	for caught := false; !caught; time.Sleep(10 * time.Millisecond) { // paces the question; the answer decides
		require.NoError(t, standby.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&caught))
	}
	_ = standby.Close(ctx)
	require.NoError(t, sb.StopReceiving(ctx))
	_, err = conn.Exec(ctx, "INSERT INTO t VALUES (3)")
	require.NoError(t, err, "asynchronous: the commit does not wait for the standby")
	oldDir := srv.Dir()
	require.NoError(t, srv.Crash(ctx))
	require.NoError(t, sb.Promote(ctx))
	require.Equal(t, sb.Dir(), srv.Dir(), "the promoted standby is the server")
	require.False(t, exists(oldDir), "the old primary's files are removed")
	conn2, err := pgx.Connect(ctx, srv.AdminDSN("postgres"))
	require.NoError(t, err)
	defer conn2.Close(ctx)
	var ids []int
	rows, err := conn2.Query(ctx, "SELECT id FROM t ORDER BY id")
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, ids, "row 3 was committed after the standby stopped receiving")
	_, err = conn2.Exec(ctx, "INSERT INTO t VALUES (4)")
	require.NoError(t, err, "the promoted standby accepts writes")
}
