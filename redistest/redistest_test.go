package redistest_test

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

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/redistest"
)

// TestPersistenceAcrossKill: what a SIGKILLed instance keeps is what its
// settings keep. Without persistence a restart is empty; with AOF
// (appendfsync always) every acknowledged write is back; Wipe empties it.
func TestPersistenceAcrossKill(t *testing.T) {
	if os.Getenv(redistest.EnvAddr) != "" {
		t.Skipf("%s names a server the tests cannot kill", redistest.EnvAddr)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		settings []string
		kept     bool
	}{
		{"no persistence", nil, false},
		{"aof always", []string{"appendonly yes", "appendfsync always"}, true},
		{"aof everysec", []string{"appendonly yes", "appendfsync everysec"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := redistest.New(t, tc.settings...)
			require.Equal(t, redistest.KindLocal, s.Kind)
			c, err := s.Client()
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
			pid := s.PID()
			require.NoError(t, s.Kill(ctx))
			require.False(t, processAlive(pid), "killed instance still alive")
			require.Error(t, c.Ping(ctx).Err(), "a killed instance answered")
			require.NoError(t, s.Restart(ctx))
			v, err := c.Get(ctx, "k").Result()
			if tc.kept {
				require.NoError(t, err)
				require.Equal(t, "v", v)
			} else {
				require.ErrorIs(t, err, redis.Nil)
			}
			require.NoError(t, s.Stop(ctx))
			require.NoError(t, s.Wipe())
			require.NoError(t, s.Restart(ctx))
			require.ErrorIs(t, c.Get(ctx, "k").Err(), redis.Nil, "a wiped instance kept data")
		})
	}
}

// TestNothingLeftBehind starts instances in helper processes (the test
// binary re-executed), ends them normally, by a panic and by SIGKILL, and
// checks that no redis-server and no temp dir outlive them.
func TestNothingLeftBehind(t *testing.T) {
	if os.Getenv(redistest.EnvAddr) != "" {
		t.Skipf("nothing to clean up when %s is set", redistest.EnvAddr)
	}
	var wg sync.WaitGroup
	for _, mode := range []string{"exit", "panic", "sigkill"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir, pid, err := runHelper(mode)
			if err != nil {
				t.Errorf("%s: %v", mode, err)
				return
			}
			if err := waitGone(dir, pid, time.Minute); err != nil {
				t.Errorf("%s: %v", mode, err)
			}
		}()
	}
	wg.Wait()
}

func runHelper(mode string) (dir string, pid int, err error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "REDISTEST_HELPER="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", 0, err
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "REDIS "); ok {
			f := strings.Fields(rest)
			dir = f[0]
			pid, _ = strconv.Atoi(f[1])
			break
		}
	}
	if dir == "" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return "", 0, fmt.Errorf("helper never reported its instance: %s", stderr.String())
	}
	if !processAlive(pid) {
		return "", 0, fmt.Errorf("redis-server %d not running while the helper lives", pid)
	}
	if mode == "sigkill" {
		_ = cmd.Process.Signal(syscall.SIGKILL)
	}
	go func() {
		for sc.Scan() {
		}
	}()
	werr := cmd.Wait()
	if (mode == "exit") != (werr == nil) {
		return "", 0, fmt.Errorf("helper in mode %s: %v\n%s", mode, werr, stderr.String())
	}
	return dir, pid, nil
}

// waitGone polls until the guard has killed the instance and removed its
// dir: it waits for cleanup after a process is gone and synchronises
// nothing else.
func waitGone(dir string, pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		_, statErr := os.Stat(dir)
		if errors.Is(statErr, os.ErrNotExist) && !processAlive(pid) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, statErr := os.Stat(dir)
	return fmt.Errorf("after %v: dir %s exists=%v, redis-server %d alive=%v", limit, dir, statErr == nil, pid, processAlive(pid))
}

func TestHelperProcess(t *testing.T) {
	mode := os.Getenv("REDISTEST_HELPER")
	if mode == "" {
		t.Skip("helper process for TestNothingLeftBehind")
	}
	s, err := redistest.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("REDIS %s %d\n", s.Dir(), s.PID())
	switch mode {
	case "exit":
		os.Exit(0) // no Close: the guard must clean up
	case "panic":
		panic("helper panics with a running redis-server")
	case "sigkill":
		select {} // the parent kills us
	}
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return errors.Is(err, syscall.EPERM)
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
		return false // a zombie only waits to be reaped
	}
	return true
}
