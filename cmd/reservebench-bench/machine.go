package main

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/reservebench/reservebench/bench"
	"github.com/reservebench/reservebench/pgtest"
)

// machine describes where the run happened.
type machine struct {
	GOOS, GOARCH    string
	CPUModel        string
	Cores           int
	MemoryGiB       float64
	Kernel          string
	GoVersion       string
	PostgresVersion string
	PgbenchVersion  string
	ServerKind      string
	Settings        map[string]string
	// FdatasyncMs is the median time of an 8 kB write plus fdatasync in the
	// cluster's directory: roughly the floor of one commit with fsync on.
	FdatasyncMs float64
}

// settingNames are the server settings the report shows.
var settingNames = []string{
	"server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
	"wal_level", "shared_buffers", "max_connections", "checkpoint_timeout", "max_wal_size",
	"autovacuum", "commit_delay", "default_transaction_isolation",
}

func describe(ctx context.Context, srv *pgtest.Server, env *bench.Env) (*machine, error) {
	m := &machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, Cores: runtime.NumCPU(), GoVersion: runtime.Version(),
		PostgresVersion: srv.Version, ServerKind: string(srv.Kind)}
	m.CPUModel = cpuModel()
	m.MemoryGiB = memGiB()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if env.Pgbench != nil {
		m.PgbenchVersion = env.Pgbench.Version(ctx)
	}
	settings, err := env.Settings(ctx, settingNames...)
	if err != nil {
		return nil, err
	}
	m.Settings = settings
	if dir := srv.Dir(); dir != "" {
		m.FdatasyncMs = fdatasyncMs(dir)
	}
	return m, nil
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memGiB() float64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "MemTotal:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / (1 << 20)
			}
		}
	}
	return 0
}

// fdatasyncMs writes 8 kB and calls fdatasync 200 times in dir (the same
// file system as the cluster's WAL) and returns the median time.
func fdatasyncMs(dir string) float64 {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return 0
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 8192)
	var xs []float64
	for i := 0; i < 200; i++ {
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i%16)*8192); err != nil {
			return 0
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return 0
		}
		xs = append(xs, float64(time.Since(t0))/float64(time.Millisecond))
	}
	sort.Float64s(xs)
	return xs[len(xs)/2]
}
