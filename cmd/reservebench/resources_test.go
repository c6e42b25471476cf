package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/redistest"
)

// TestServeStartsItsRedis: serving a strategy that needs a Redis, with no
// RESERVEBENCH_REDIS, starts a throwaway redis-server, says where, serves
// through it (201 HELD), and stops it on SIGTERM: nothing answers at its
// address after the exit.
func TestServeStartsItsRedis(t *testing.T) {
	if _, err := redistest.FindServer(); err != nil {
		t.Skipf("no local redis-server to start: %v", err) // the Redis tests say how to get one
	}
	bin := filepath.Join(t.TempDir(), "reservebench")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())

	d := pgtest.NewDatabase(t)
	cmd := exec.Command(bin, "serve", "-addr", "127.0.0.1:0", "-log-every", "0", "rediscounter")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, redistest.EnvAddr+"=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, pgtest.EnvDSN+"="+d.DSN)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "stderr: %s", stderr.String())
	m := regexp.MustCompile(`on http://(\S+) `).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	go io.Copy(io.Discard, stdout) //nolint:errcheck

	sock := regexp.MustCompile(`redis: a throwaway server at unix://(\S+),`).FindStringSubmatch(stderr.String())
	require.NotNil(t, sock, "serve says where its Redis is; stderr: %s", stderr.String())

	resp, err := http.PostForm("http://"+m[1]+"/reserve", url.Values{"request_key": {"req-1"}, "user": {"user-1"}, "sku": {"sku-lab-01"}, "ttl_ms": {"60000"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		require.NoError(t, err, "stderr: %s", stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("serve did not exit after SIGTERM; stderr: %s", stderr.String())
	}
	if c, err := net.Dial("unix", sock[1]); err == nil {
		c.Close()
		t.Fatalf("the throwaway Redis at %s still answers after serve exited", sock[1])
	}
}
