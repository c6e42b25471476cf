package redistest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// localServer is a throwaway redis-server in dir:
//
//	dir/redis.conf   the configuration (port 0: no TCP port to collide on)
//	dir/redis.sock   the Unix socket
//	dir/redis.pid    the pid of the current process (the guard reads it)
//	dir/redis.log    the server log
//	dir/data/        AOF and snapshot, if the settings turn them on
type localServer struct {
	bin   string
	dir   string
	guard *exec.Cmd
	pipe  io.WriteCloser // closing it (or dying) tells the guard to clean up

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited and been reaped
}

// FindServer returns the redis-server binary, in the order of the package
// comment.
func FindServer() (string, error) {
	var candidates []string
	if b := os.Getenv(EnvServer); b != "" {
		candidates = append(candidates, b)
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		candidates = append(candidates, p)
	}
	candidates = append(candidates, "/usr/bin/redis-server", "/usr/local/bin/redis-server", "/opt/homebrew/bin/redis-server")
	for _, b := range candidates {
		if fi, err := os.Stat(b); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return b, nil
		}
	}
	return "", fmt.Errorf("no redis-server binary (looked in %s, PATH, /usr/bin, /usr/local/bin, /opt/homebrew/bin)", EnvServer)
}

// serverRoot is where a throwaway server's directory goes: in a test
// binary, /dev/shm when it has room, so that its files, AOF among them,
// are in memory. On a disk, a background fsync that lags (this machine's
// swings by 10x) makes Redis with appendfsync everysec postpone its AOF
// write for up to 2 s and reply anyway, so a SIGKILL then loses
// acknowledged writes, by chance: table 28-1 once showed drift -53 where it
// shows 0. The tests judge what a process crash does, and the table must
// repeat; the benchmarks and reservebench serve, which are not test
// binaries, keep the temporary directory and its disk.
func serverRoot() string {
	const shm = "/dev/shm"
	var st syscall.Statfs_t
	if !testing.Testing() || syscall.Statfs(shm, &st) != nil || uint64(st.Bavail)*uint64(st.Bsize) < 256<<20 {
		return ""
	}
	return shm
}

func (l *localServer) addr() string { return "unix://" + filepath.Join(l.dir, "redis.sock") }

func startLocal(ctx context.Context, settings []string) (_ *localServer, err error) {
	bin, err := FindServer()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(serverRoot(), "redistest-")
	if err != nil {
		return nil, err
	}
	l := &localServer{bin: bin, dir: dir}
	if err := l.startGuard(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = l.close()
		}
	}()
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o700); err != nil {
		return nil, err
	}
	if err := l.writeConf(settings); err != nil {
		return nil, err
	}
	if err := l.start(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *localServer) writeConf(settings []string) error {
	lines := []string{
		"# written by reservebench/redistest",
		"port 0",
		"unixsocket " + filepath.Join(l.dir, "redis.sock"),
		"unixsocketperm 700",
		"pidfile " + filepath.Join(l.dir, "redis.pid"),
		"logfile " + filepath.Join(l.dir, "redis.log"),
		"dir " + filepath.Join(l.dir, "data"),
		"daemonize no",
		// No snapshots unless a strategy asks: what survives a restart is
		// exactly what its settings keep.
		`save ""`,
		"appendonly no",
		"maxclients 10000",
	}
	if debugCommandKnown(l.bin) {
		// DEBUG SLEEP stops the server without a core spinning, where the
		// kit's busy script spins one for the whole stall: redis-restart's
		// stalls of 8 s took a core each, some 25 of them a table.
		lines = append(lines, "enable-debug-command local")
	}
	lines = append(lines, settings...)
	return os.WriteFile(filepath.Join(l.dir, "redis.conf"), []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// debugCommandKnown reports whether bin is Redis 7 or later, which refuses
// DEBUG unless enable-debug-command allows it and refuses to start on that
// line when older.
func debugCommandKnown(bin string) bool {
	debugKnown.once.Do(func() {
		out, err := exec.Command(bin, "--version").Output()
		if err != nil {
			return
		}
		_, v, ok := strings.Cut(string(out), " v=")
		major, _, _ := strings.Cut(v, ".")
		n, err := strconv.Atoi(major)
		debugKnown.yes = ok && err == nil && n >= 7
	})
	return debugKnown.yes
}

var debugKnown struct {
	once sync.Once
	yes  bool
}

// start runs redis-server on the configuration and waits until it answers
// PING over its socket (polling the server, which is how its readiness is
// known; nothing else waits on it).
func (l *localServer) start(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cmd != nil {
		select {
		case <-l.done:
		default:
			return fmt.Errorf("redistest: start: the server is still running (pid %d)", l.cmd.Process.Pid)
		}
	}
	cmd := exec.Command(l.bin, filepath.Join(l.dir, "redis.conf"))
	cmd.Dir = l.dir
	// Its own process group: a Ctrl-C at the terminal reaches the test
	// process, whose exit makes the guard clean up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", l.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	l.cmd, l.done = cmd, done

	c := redis.NewClient(&redis.Options{Network: "unix", Addr: filepath.Join(l.dir, "redis.sock"), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, redis.ErrClosed) || strings.Contains(err.Error(), "LOADING") {
			err = nil // still loading its AOF: keep asking
		}
		select {
		case <-done:
			return fmt.Errorf("redistest: redis-server exited while starting: %s", l.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: redis-server did not answer within 30s (%v): %s", err, l.logTail())
		}
	}
}

func (l *localServer) running() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cmd == nil {
		return false
	}
	select {
	case <-l.done:
		return false
	default:
		return true
	}
}

func (l *localServer) signal(ctx context.Context, sig syscall.Signal) error {
	l.mu.Lock()
	cmd, done := l.cmd, l.done
	l.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil // already gone
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("redistest: signal %v: %w", sig, err)
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("redistest: redis-server did not exit after %v: %w", sig, ctx.Err())
	}
}

func (l *localServer) kill(ctx context.Context) error { return l.signal(ctx, syscall.SIGKILL) }

func (l *localServer) stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := l.signal(ctx, syscall.SIGTERM); err != nil {
		_ = l.kill(context.Background())
		return err
	}
	return nil
}

func (l *localServer) wipe() error {
	if l.running() {
		return fmt.Errorf("redistest: wipe: the server is running; stop or kill it first")
	}
	data := filepath.Join(l.dir, "data")
	if err := os.RemoveAll(data); err != nil {
		return fmt.Errorf("redistest: wipe: %w", err)
	}
	return os.Mkdir(data, 0o700)
}

func (l *localServer) logTail() string {
	b, _ := os.ReadFile(filepath.Join(l.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// guardScript waits for EOF on stdin, which comes when the test process
// closes the pipe or dies in any way, then kills the server whose pid is in
// the pidfile (if that pid is still a redis-server) and removes the dir.
const guardScript = `
trap '' INT TERM HUP
dir="$1"
cat >/dev/null
pidfile="$dir/redis.pid"
if [ -f "$pidfile" ]; then
  pid=$(head -n 1 "$pidfile")
  if [ -n "$pid" ] && grep -q redis "/proc/$pid/cmdline" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i+1)); done
  fi
fi
rm -rf "$dir"
`

func (l *localServer) startGuard() error {
	cmd := exec.Command("/bin/sh", "-c", guardScript, "redistest-guard", l.dir)
	pipe, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start guard: %w", err)
	}
	l.guard, l.pipe = cmd, pipe
	return nil
}

// close stops the server, lets the guard remove the dir, and waits for it.
// It is idempotent.
func (l *localServer) close() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.kill(ctx); err != nil {
		errs = append(errs, err)
	}
	if l.pipe != nil {
		_ = l.pipe.Close()
		l.pipe = nil
		if err := l.guard.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("redistest: guard: %w", err))
		}
	}
	if err := os.RemoveAll(l.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
