package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5/pgconn"
)

// PgbenchScripter is implemented by a strategy.Deployment whose reservation
// pgbench can replay: PgbenchScript returns a pgbench custom script that
// runs one reservation of one unit of sku with the same SQL statements, in
// the same order and in the same transactions, as the deployment's
// Node(0).Reserve sends on its way to HELD. The text of each statement is
// the strategy's own constant (built from it in the strategy's package, so
// the two cannot drift apart), with its $n parameters written as pgbench
// variables. The harness prepends [PgbenchPrologue] and sets these
// variables before every run of the script:
//
//	:key     a request key no other request of the trial uses (an integer)
//	:user    the request's user (the same integer: every request is a new buyer)
//	:sku     sku
//	:ttl_us  the reservation's TTL in microseconds
//
// A script may \set variables of its own (a value the Go code computes on
// the client, such as a hash). It runs under pgbench -M prepared, as pgx
// prepares and caches statements. It replays the HELD path only: pgbench
// cannot branch on the row count of a statement without changing the
// statement, so the harness runs it only on a stock that does not sell out
// and checks the reservations it made with the deployment's audit.
//
// A deployment without it gets no pgbench run and no Go/pgbench ratio. A
// strategy that decides partly in memory (memquota) or in Redis can only
// hand pgbench its database part; it says so with PgbenchPartial.
type PgbenchScripter interface {
	PgbenchScript(sku string) (string, error)
}

// PgbenchPartial is implemented by deployments whose pgbench script is
// only the database part of Node(0).Reserve's HELD path. PgbenchLeavesOut
// names what the script leaves out ("the Lua script in Redis that takes
// the unit"); the report prints it beside the Go/pgbench ratios, which are
// below 1 by what that part costs, not only by what the Go client adds.
type PgbenchPartial interface {
	PgbenchLeavesOut() string
}

// PgbenchRetrier is implemented by deployments whose transactions are
// retried after a serialization failure or a deadlock: pgbench then runs
// with --max-tries, so that it retries as the Go code does (without its
// pause between attempts).
type PgbenchRetrier interface {
	PgbenchMaxTries() int
}

// PgbenchControlScripter is implemented by deployments that also offer
// control scripts: not a reservation, but one part of it in isolation (for
// example the stock decrement alone), keyed by a short name. The harness
// runs them with pgbench beside the reservation, under the same variables,
// to show which part of the reservation costs what.
type PgbenchControlScripter interface {
	PgbenchControls(sku string) (map[string]string, error)
}

// PgbenchPrologue sets :key and :user for each run of the script: client
// c's n-th transaction gets base + c*KeyStride + n, as Load.Key does for the
// Go clients.
const PgbenchPrologue = `\set n :n + 1
\set key :base + :client_id * 1000000000 + :n
\set user :key
`

// Pgbench runs pgbench.
type Pgbench struct {
	// Path is the pgbench binary.
	Path string
}

// FindPgbench looks for pgbench in binDir (pgtest.Server.BinDir), then on
// PATH.
func FindPgbench(binDir string) (*Pgbench, error) {
	if binDir != "" {
		p := filepath.Join(binDir, "pgbench")
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return &Pgbench{Path: p}, nil
		}
	}
	p, err := exec.LookPath("pgbench")
	if err != nil {
		return nil, fmt.Errorf("bench: no pgbench in %q or on PATH", binDir)
	}
	return &Pgbench{Path: p}, nil
}

// Version returns pgbench --version.
func (p *Pgbench) Version(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, p.Path, "--version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// pgbenchRun is one pgbench invocation.
type pgbenchRun struct {
	dsn       string
	script    string
	vars      map[string]string
	clients   int
	threads   int
	duration  time.Duration // whole seconds
	txns      int           // > 0: -t txns per client instead of -T
	rate      float64
	lateLimit time.Duration
	maxTries  int // > 1: --max-tries
	progress  func(line string)
}

// PgbenchResult is what pgbench reported, beside the Run built from its
// per-transaction log.
type PgbenchResult struct {
	Args         []string `json:"args"`
	TPS          float64  `json:"tps"` // "without initial connection time"
	Transactions int64    `json:"transactions"`
	Failed       int64    `json:"failed"`
	Skipped      int64    `json:"skipped"`
	ConnectMs    float64  `json:"connect_ms"`
	Aborted      bool     `json:"aborted"` // a client aborted: the script failed
	Output       string   `json:"-"`
}

var (
	reTPS      = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	reTxns     = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
	reFailed   = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	reSkipped  = regexp.MustCompile(`(?m)^number of transactions skipped: (\d+)`)
	reConnTime = regexp.MustCompile(`(?m)^initial connection time = ([0-9.]+) ms`)
)

// run runs pgbench and builds the Run from its per-transaction log.
func (p *Pgbench) run(ctx context.Context, r pgbenchRun) (*Run, *PgbenchResult, error) {
	cfg, err := pgconn.ParseConfig(r.dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: pgbench: parse dsn: %w", err)
	}
	dir, err := os.MkdirTemp("", "reservebench-pgbench-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	scriptPath := filepath.Join(dir, "reserve.sql")
	if err := os.WriteFile(scriptPath, []byte(r.script), 0o644); err != nil {
		return nil, nil, err
	}
	secs := int(r.duration.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	threads := r.threads
	if threads < 1 {
		threads = 1
	}
	if threads > r.clients {
		threads = r.clients
	}
	args := []string{
		"-n",             // no vacuum of pgbench's own tables: there are none
		"-M", "prepared", // as pgx: statements prepared once per connection
		"-c", strconv.Itoa(r.clients), "-j", strconv.Itoa(threads),
		"-P", "1",
		"-f", scriptPath,
		"-l", "--log-prefix=" + filepath.Join(dir, "log"),
		"-h", cfg.Host, "-p", strconv.Itoa(int(cfg.Port)), "-U", cfg.User,
	}
	if r.txns > 0 {
		args = append(args, "-t", strconv.Itoa(r.txns))
	} else {
		args = append(args, "-T", strconv.Itoa(secs))
	}
	if r.maxTries > 1 {
		args = append(args, "--max-tries", strconv.Itoa(r.maxTries))
	}
	if r.rate > 0 {
		args = append(args, "--rate", strconv.FormatFloat(r.rate, 'f', 1, 64))
		if r.lateLimit > 0 {
			args = append(args, "--latency-limit", strconv.FormatFloat(float64(r.lateLimit)/float64(time.Millisecond), 'f', 1, 64))
		}
	}
	keys := make([]string, 0, len(r.vars))
	for k := range r.vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-D", k+"="+r.vars[k])
	}
	args = append(args, cfg.Database)
	cmd := exec.CommandContext(ctx, p.Path, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PGSSLMODE=disable", "PGAPPNAME=reservebench-pgbench")
	if cfg.Password != "" {
		cmd.Env = append(cmd.Env, "PGPASSWORD="+cfg.Password)
	}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	var stderr bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stderr = io.MultiWriter(&stderr, pw)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if line := sc.Text(); r.progress != nil && strings.HasPrefix(line, "progress:") {
				r.progress(line)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	cpu0 := readCPU()
	runErr := cmd.Run()
	cpu := readCPU().since(cpu0)
	cpu.Client = 0
	if ps := cmd.ProcessState; ps != nil {
		cpu.Client = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	_ = pw.Close()
	wg.Wait()

	out := stdout.String() + stderr.String()
	res := &PgbenchResult{Args: append([]string{p.Path}, args...), Output: out}
	res.Aborted = strings.Contains(out, "aborted in command") || strings.Contains(out, "Run was aborted")
	if m := reTPS.FindStringSubmatch(out); m != nil {
		res.TPS, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := reTxns.FindStringSubmatch(out); m != nil {
		res.Transactions, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reFailed.FindStringSubmatch(out); m != nil {
		res.Failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reSkipped.FindStringSubmatch(out); m != nil {
		res.Skipped, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reConnTime.FindStringSubmatch(out); m != nil {
		res.ConnectMs, _ = strconv.ParseFloat(m[1], 64)
	}
	// A run in which no transaction finished inside the window (a convoy
	// of waiters at SERIALIZABLE) prints no tps line: that is a
	// measurement of 0, not a failure of pgbench.
	none := reTxns.MatchString(out) && res.Transactions == 0
	if runErr != nil || res.Aborted || !reTPS.MatchString(out) && !none {
		return nil, res, fmt.Errorf("bench: pgbench %s: %v\n%s", strings.Join(args, " "), runErr, tailString(out, 3000))
	}

	lat, lag, late, err := readPgbenchLogs(dir, r.rate > 0)
	if err != nil {
		return nil, res, err
	}
	window := float64(secs)
	if r.txns > 0 && res.TPS > 0 {
		window = float64(res.Transactions) / res.TPS
	}
	run := &Run{
		Loop: "closed", Clients: r.clients, Window: window,
		Goodput: res.TPS, Throughput: res.TPS,
		Held: res.Transactions, HeldTotal: res.Transactions, Errors: res.Failed,
		Outcomes: map[string]int64{"TXN": res.Transactions},
		CPU:      cpu,
	}
	if res.Failed > 0 {
		run.Outcomes["FAILED"] = res.Failed
	}
	if r.rate > 0 {
		run.Loop, run.Rate = "open", r.rate
		run.Skipped = res.Skipped
		run.Sent = res.Transactions + res.Failed
		run.Planned = run.Sent + run.Skipped
		run.lag = lag
		run.Lag = quantiles(lag)
		run.Late = late
	}
	run.hist[ClassHeld] = lat
	run.HeldLatency = quantiles(lat)
	return run, res, nil
}

// readPgbenchLogs reads pgbench's per-transaction logs (-l): one line per
// transaction, "client_id transaction_no time script_no time_epoch time_us
// [schedule_lag]", time in µs ("skipped" or "failed" instead of a number
// for those). With --rate, pgbench's time runs from the transaction's
// actual start; the latency recorded here adds its schedule lag, so that
// it runs from the planned start, as the Go open loop's does. late counts
// the transactions that started more than 1 ms after their planned time.
func readPgbenchLogs(dir string, withLag bool) (lat, lag *hdrhistogram.Histogram, late int64, err error) {
	files, err := filepath.Glob(filepath.Join(dir, "log.*"))
	if err != nil {
		return nil, nil, 0, err
	}
	lat = newHist()
	if withLag {
		lag = newHist()
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, nil, 0, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 6 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				continue // skipped or failed
			}
			if withLag && len(fields) >= 7 {
				if l, err := strconv.ParseInt(fields[6], 10, 64); err == nil {
					record(lag, time.Duration(l)*time.Microsecond)
					us += l
					if l > 1000 {
						late++
					}
				}
			}
			record(lat, time.Duration(us)*time.Microsecond)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, nil, 0, err
		}
	}
	return lat, lag, late, nil
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
