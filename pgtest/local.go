package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// localCluster is a throwaway cluster in dir:
//
//	dir/data       the data directory
//	dir/server.log the server log
//	dir/.s.PGSQL.5432 the Unix socket (listen_addresses is empty: no TCP port to collide on)
type localCluster struct {
	bin   string
	dir   string
	cred  *syscall.Credential // set when running as root: the postgres user
	guard *exec.Cmd
	pipe  io.WriteCloser // closing it (or dying) tells the guard to clean up
	env   []string       // the server's extra environment (Options.ClockAhead)
}

const socketPort = 5432

func (c *localCluster) dataDir() string { return filepath.Join(c.dir, "data") }

func (c *localCluster) dsn(database string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable", c.dir, socketPort, database)
}

// FindBinDir returns the directory holding initdb, pg_ctl and postgres, in the
// order of the package comment.
func FindBinDir() (string, error) {
	var candidates []string
	if d := os.Getenv(EnvBinDir); d != "" {
		candidates = append(candidates, d)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	candidates = append(candidates, globNewestFirst("/usr/lib/postgresql/*/bin")...)
	candidates = append(candidates, globNewestFirst("/opt/homebrew/opt/postgresql@*/bin")...)
	candidates = append(candidates, globNewestFirst("/usr/local/opt/postgresql@*/bin")...)
	candidates = append(candidates, "/opt/homebrew/bin", "/usr/local/bin", "/usr/local/pgsql/bin")
	for _, d := range candidates {
		if hasAll(d, "initdb", "pg_ctl", "postgres") {
			return d, nil
		}
	}
	return "", fmt.Errorf("no directory with initdb, pg_ctl and postgres (looked in %s, pg_config --bindir, PATH, /usr/lib/postgresql/*/bin, Homebrew)", EnvBinDir)
}

func globNewestFirst(pattern string) []string {
	m, _ := filepath.Glob(pattern)
	// postgresql/9.6 < postgresql/15: compare the version numerically.
	version := func(p string) float64 {
		for _, part := range strings.Split(p, string(filepath.Separator)) {
			part = strings.TrimPrefix(part, "postgresql@")
			if v, err := strconv.ParseFloat(part, 64); err == nil {
				return v
			}
		}
		return 0
	}
	sort.Slice(m, func(i, j int) bool { return version(m[i]) > version(m[j]) })
	return m
}

func hasAll(dir string, names ...string) bool {
	for _, n := range names {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// serverCredential returns the credential to run the server with: nil for a
// normal user, the postgres user when running as root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root, but there is no 'postgres' user to run it as (%v); create one (useradd --system postgres) or set %s", err, EnvDSN)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

func startLocal(ctx context.Context, opts Options) (_ *localCluster, err error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(clusterRoot(opts), "pgtest-")
	if err != nil {
		return nil, err
	}
	c := &localCluster{bin: bin, dir: dir, cred: cred, env: opts.serverEnv()}
	if err := c.startGuard(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = c.stop()
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	if err := c.run(ctx, filepath.Join(bin, "initdb"), "-D", c.dataDir(), "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, fmt.Errorf("initdb: %w", err)
	}
	if err := c.writeConf(opts); err != nil {
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *localCluster) writeConf(opts Options) error {
	maxConn := opts.MaxConnections
	if maxConn == 0 {
		maxConn = 300
	}
	fsync := "off"
	if opts.Fsync {
		fsync = "on"
	}
	lines := []string{
		"# written by reservebench/pgtest",
		"listen_addresses = ''",
		fmt.Sprintf("unix_socket_directories = '%s'", c.dir),
		fmt.Sprintf("port = %d", socketPort),
		fmt.Sprintf("max_connections = %d", maxConn),
		"fsync = " + fsync,
		"full_page_writes = " + fsync,
		// synchronous_commit stays on: an acknowledged commit must survive an
		// immediate shutdown (the crash scenarios check it).
		"synchronous_commit = on",
		"shared_buffers = 128MB",
		"logging_collector = off",
		"log_min_messages = warning",
	}
	if !shmUsable() || strings.HasPrefix(c.dir, shmDir+"/") {
		// A small or full /dev/shm (seed 000 met one) makes initdb's default
		// posix segments fail; mmap files in the data dir work anywhere and
		// change nothing about transactions, locks or WAL. A cluster in
		// /dev/shm uses them too: they go with its directory, where posix
		// segments of a server stopped with -m immediate stay behind.
		lines = append(lines, "dynamic_shared_memory_type = mmap")
	}
	lines = append(lines, opts.Settings...)
	f, err := os.OpenFile(filepath.Join(c.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString("\n" + strings.Join(lines, "\n") + "\n")
	if err := f.Close(); werr == nil {
		werr = err
	}
	return werr
}

const shmDir = "/dev/shm"

func shmUsable() bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(shmDir, &st); err != nil {
		return false
	}
	return st.Bavail*uint64(st.Bsize) > 256<<20
}

// clusterRoot is where a cluster's directory goes: for a cluster without
// fsync (every test's), a memory file system when the machine has one with
// room (/dev/shm, at least 4 GiB free), else the temporary directory. With
// fsync off the disk adds nothing a test checks (see Options.Fsync), and
// on ext4 creating and dropping a database per test and a base backup per
// failover cost table 28-1 a fifth of its CPU in inode allocation.
// Benchmarks keep fsync, hence the disk.
func clusterRoot(opts Options) string {
	if opts.Fsync || os.Getenv(EnvOnDisk) != "" {
		return ""
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(shmDir, &st); err != nil || st.Bavail*uint64(st.Bsize) < 4<<30 {
		return ""
	}
	if syscall.Access(shmDir, 2 /* W_OK */) != nil {
		return ""
	}
	return shmDir
}

func (c *localCluster) start(ctx context.Context) error {
	err := c.pgctl(ctx, "start", "-w", "-t", "60", "-l", filepath.Join(c.dir, "server.log"))
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		return fmt.Errorf("pg_ctl start: %w\nserver.log:\n%s", err, tail(log, 2000))
	}
	return nil
}

func (c *localCluster) pgctl(ctx context.Context, args ...string) error {
	args = append([]string{"-D", c.dataDir()}, args...)
	return c.run(ctx, filepath.Join(c.bin, "pg_ctl"), args...)
}

// run runs a PostgreSQL program as the server's user. Its output goes to a
// file, never to a pipe: pg_ctl start leaves a daemon behind that would hold a
// pipe open (and `go test` waiting) for as long as it runs.
func (c *localCluster) run(ctx context.Context, prog string, args ...string) error {
	out, err := os.CreateTemp(c.dir, "cmd-*.log")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if filepath.Base(prog) == "pg_ctl" {
		cmd.Env = append(cmd.Env, c.env...) // the server inherits pg_ctl's
	}
	// Its own process group: a Ctrl-C at the terminal must reach the test
	// process (whose exit makes the guard clean up), not kill the server
	// half-way through a step.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	if runErr := cmd.Run(); runErr != nil {
		_, _ = out.Seek(0, io.SeekStart)
		msg, _ := io.ReadAll(out)
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(prog), strings.Join(args, " "), runErr, tail(msg, 2000))
	}
	return nil
}

// guardScript waits for EOF on stdin, which comes when the test process closes
// the pipe or dies in any way, then stops the server (SIGQUIT is PostgreSQL's
// immediate shutdown) and removes the cluster's directory.
const guardScript = `
trap '' INT TERM HUP
dir="$1"
cat >/dev/null
pidfile="$dir/data/postmaster.pid"
if [ -f "$pidfile" ]; then
  pid=$(head -n 1 "$pidfile")
  if [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null; then
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i+1)); done
    kill -KILL "$pid" 2>/dev/null
  fi
fi
rm -rf "$dir"
`

func (c *localCluster) startGuard() error {
	cmd := exec.Command("/bin/sh", "-c", guardScript, "pgtest-guard", c.dir)
	pipe, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = nil, nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start guard: %w", err)
	}
	c.guard, c.pipe = cmd, pipe
	return nil
}

// stop shuts the server down and removes its directory. It is idempotent.
func (c *localCluster) stop() error {
	var errs []error
	if _, err := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := c.pgctl(ctx, "stop", "-m", "fast", "-w"); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	if c.pipe != nil {
		_ = c.pipe.Close() // the guard then finds no server and removes the dir
		c.pipe = nil
		if err := c.guard.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("guard: %w", err))
		}
	}
	if err := os.RemoveAll(c.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (c *localCluster) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(c.dataDir(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := bytes.Cut(b, []byte("\n"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(first)))
	return pid
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
