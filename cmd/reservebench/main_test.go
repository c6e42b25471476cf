package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestBadUsage: every bad command line is refused with a *UsageError
// naming what is wrong, exit status 2, before anything starts.
func TestBadUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "usage: reservebench serve"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"serve"}, "want one STRATEGY, got 0"},
		{[]string{"serve", "hotrow", "slotrows"}, "want one STRATEGY, got 2"},
		{[]string{"serve", "nosuch"}, `unknown strategy "nosuch"`},
		{[]string{"serve", "-nosuchflag", "hotrow"}, "flag provided but not defined: -nosuchflag"},
		{[]string{"serve", "-inflight", "0", "hotrow"}, "-inflight: must be at least 1"},
		{[]string{"serve", "-inflight", "four", "hotrow"}, `invalid value "four" for flag -inflight`},
		{[]string{"serve", "-queue", "-1", "hotrow"}, "-queue: must not be negative"},
		{[]string{"serve", "-wait", "0s", "hotrow"}, "-wait: must be positive when -queue is"},
		{[]string{"serve", "-addr", "0.0.0.0:8080", "hotrow"}, "not a loopback address"},
		{[]string{"serve", "-addr", "localhost", "hotrow"}, "-addr: address localhost: missing port"},
		{[]string{"serve", "-stock", "sku-a", "hotrow"}, `-stock: "sku-a" is not sku=total`},
		{[]string{"serve", "-stock", "sku-a=-3", "hotrow"}, "-stock: \"sku-a=-3\": total must be"},
		{[]string{"serve", "-stock", "sku-a=1,sku-a=2", "hotrow"}, `sku "sku-a" given twice`},
		{[]string{"serve", "-work-timeout", "0s", "hotrow"}, "-work-timeout: must be positive"},
		{[]string{"serve", "hotrow", "-pool", "-2"}, "-pool: must not be negative"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(c.args, &stdout, &stderr)
		require.Equal(t, 2, code, "%q: %s", c.args, stderr.String())
		require.Contains(t, stderr.String(), c.want, "%q", c.args)
	}
	_, err := parseServe([]string{"-inflight", "0", "hotrow"}, io.Discard)
	var ue *UsageError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, "inflight", ue.Flag)
}

// TestServeStopsCleanly runs the command as a real process over a database
// of the test's: requests admitted before SIGTERM finish (they are held by
// a lock on the stock row, seen in pg_stat_activity), a queued one is
// refused with 503, and the process exits 0 with every 201 in the
// database and nothing left listening.
func TestServeStopsCleanly(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "reservebench")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())

	d := pgtest.NewDatabase(t)
	admin := d.AdminPool(t, 4)
	cmd := exec.Command(bin, "serve", "-addr", "127.0.0.1:0", "-inflight", "2", "-queue", "2", "-wait", "1m", "-log-every", "0", "hotrow")
	cmd.Env = append(os.Environ(), pgtest.EnvDSN+"="+d.DSN)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "stderr: %s", stderr.String())
	m := regexp.MustCompile(`on http://(\S+) `).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	base := "http://" + m[1]
	go io.Copy(io.Discard, stdout) //nolint:errcheck

	ctx := context.Background()
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT * FROM sku_stock WHERE sku = 'sku-lab-01' FOR UPDATE`)
	require.NoError(t, err)

	codes := make([]atomic.Int64, 3)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := url.Values{"request_key": {"req-" + string(rune('a'+i))}, "user": {"user-" + string(rune('a'+i))}, "sku": {"sku-lab-01"}, "ttl_ms": {"60000"}}
			resp, err := http.PostForm(base+"/reserve", v)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			resp.Body.Close()
			codes[i].Store(int64(resp.StatusCode))
		}()
	}
	require.Eventually(t, func() bool {
		var blocked int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&blocked)
		return err == nil && blocked == 2 && statusCount(base, "waiting") == 1
	}, 30*time.Second, 5*time.Millisecond, "two requests blocked on the row lock and one queued")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	// The queued request is refused at once; the admitted two still wait
	// on the lock, so the process cannot have exited yet.
	require.Eventually(t, func() bool {
		n := 0
		for i := range codes {
			if codes[i].Load() == 503 {
				n++
			}
		}
		return n == 1
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Rollback(ctx))
	wg.Wait()
	select {
	case err := <-exited:
		require.NoError(t, err, "stderr: %s", stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("serve did not exit after SIGTERM; stderr: %s", stderr.String())
	}
	require.Equal(t, 0, cmd.ProcessState.ExitCode())
	held := 0
	for i := range codes {
		if codes[i].Load() == 201 {
			held++
		}
	}
	require.Equal(t, 2, held, "two admitted requests answered 201")
	var rows int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM reservation WHERE status = 'HELD'`).Scan(&rows))
	require.Equal(t, 2, rows)
	require.Contains(t, stderr.String(), "stopped:")
	_, err = http.Get(base + "/status")
	require.Error(t, err, "nothing listens after the exit")
}

// TestManyProcesses measures what seed 000 leaves out: three serve
// processes over one database, each with -inflight 4, and how many
// reservations the database runs at once. Every admitted request is held
// by a lock on the stock row, so the count is read from pg_stat_activity
// once every request is admitted or queued and every admitted one waits on
// that lock. Per-process gates let in their sum, 12; with
// -global-inflight 4 (advisory-lock slots in the database) the database
// sees 4. It also logs what a reservation costs through one process, one
// client at a time, with and without the slots (a measurement, not a
// check).
func TestManyProcesses(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "reservebench")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	for _, c := range []struct {
		name string
		args []string
		want int
	}{
		{"per-process", nil, 12},
		{"global-inflight-4", []string{"-global-inflight", "4"}, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			inDB, perCall := manyProcesses(t, bin, c.args)
			t.Logf("3 serve processes with -inflight 4 %v: %d reservations at once in the database; %v per reservation, one client, through one process",
				c.args, inDB, perCall)
			require.Equal(t, c.want, inDB)
		})
	}
}

func manyProcesses(t *testing.T, bin string, extra []string) (inDB int, perCall time.Duration) {
	d := pgtest.NewDatabase(t)
	admin := d.AdminPool(t, 4)
	ctx := context.Background()

	const procs, inflight, queued = 3, 4, 2
	var bases []string
	var cmds []*exec.Cmd
	var exits []chan error
	for i := 0; i < procs; i++ {
		args := append([]string{"serve", "-addr", "127.0.0.1:0", "-inflight", fmt.Sprint(inflight), "-queue", "8", "-wait", "1m", "-log-every", "0", "-expire-every", "0",
			"-stock", "sku-lab-01=1000"}, extra...)
		if i > 0 {
			args = append(args, "-attach")
		}
		cmd := exec.Command(bin, append(args, "hotrow")...)
		cmd.Env = append(os.Environ(), pgtest.EnvDSN+"="+d.DSN)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr syncBuffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		exit := make(chan error, 1)
		go func() { exit <- cmd.Wait() }()
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
			}
		})
		line, err := bufio.NewReader(stdout).ReadString('\n')
		require.NoError(t, err, "process %d: %s", i, stderr.String())
		m := regexp.MustCompile(`on http://(\S+) `).FindStringSubmatch(line)
		require.NotNil(t, m, line)
		go io.Copy(io.Discard, stdout) //nolint:errcheck
		bases, cmds, exits = append(bases, "http://"+m[1]), append(cmds, cmd), append(exits, exit)
	}

	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT * FROM sku_stock WHERE sku = 'sku-lab-01' FOR UPDATE`)
	require.NoError(t, err)

	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	post := func(base, key string) int {
		v := url.Values{"request_key": {key}, "user": {"user-" + key}, "sku": {"sku-lab-01"}, "ttl_ms": {"60000"}}
		resp, err := http.PostForm(base+"/reserve", v)
		if err != nil {
			t.Errorf("%s: %v", key, err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for p, base := range bases {
		for i := 0; i < inflight+queued; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code := post(base, fmt.Sprintf("req-%d-%d", p, i))
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}()
		}
	}
	// Settled: every request is admitted or waiting, and every admitted
	// one waits on the row lock in the database (not on an advisory lock:
	// those are the calls waiting for a slot).
	require.Eventually(t, func() bool {
		running, waiting := 0, 0
		for _, b := range bases {
			running += statusCount(b, "running")
			waiting += statusCount(b, "waiting")
		}
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND wait_event_type = 'Lock'
			  AND wait_event <> 'advisory' AND usename <> current_user`).Scan(&inDB)
		return err == nil && running+waiting == procs*(inflight+queued) && inDB == running
	}, 30*time.Second, 5*time.Millisecond, "every request admitted or waiting, the admitted ones in the database")

	require.NoError(t, tx.Rollback(ctx))
	wg.Wait()
	require.Equal(t, map[int]int{201: procs * (inflight + queued)}, codes)

	const calls = 200
	start := time.Now()
	for i := 0; i < calls; i++ {
		require.Equal(t, 201, post(bases[0], fmt.Sprintf("req-seq-%d", i)))
	}
	perCall = time.Since(start) / calls

	for i, cmd := range cmds {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, <-exits[i])
	}
	return inDB, perCall.Round(10 * time.Microsecond)
}

// statusCount reads a top-level count from GET /status, or -1.
func statusCount(base, name string) int {
	resp, err := http.Get(base + "/status")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var st map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return -1
	}
	n, ok := st[name].(float64)
	if !ok {
		return -1
	}
	return int(n)
}

// syncBuffer is a bytes.Buffer a process writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
