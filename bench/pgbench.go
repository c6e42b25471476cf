package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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

	mu sync.Mutex
	// connect is how long pgbench took to connect its clients, by client
	// and thread count (connectTime).
	connect map[[2]int]time.Duration
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
	// Measured is the closed loop's window in seconds, from the moment
	// every client had begun its first transaction, and InWindow the
	// transactions that ended in it: the goodput is their ratio, not TPS.
	Measured float64 `json:"measured_s,omitempty"`
	InWindow int64   `json:"in_window,omitempty"`
	Aborted  bool    `json:"aborted"` // a client aborted: the script failed
	Output   string  `json:"-"`
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
	measured := secs // the window the closed loop's goodput is counted over
	switch {
	case r.txns > 0:
		args = append(args, "-t", strconv.Itoa(r.txns))
	case r.rate > 0:
		args = append(args, "-T", strconv.Itoa(secs))
	default:
		connect, err := p.connectTime(ctx, r, threads)
		if err != nil {
			return nil, nil, err
		}
		secs = pgbenchSeconds(secs, connect)
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
		if r.txns == 0 && r.rate == 0 {
			p.sawConnect(r.clients, threads, time.Duration(res.ConnectMs*float64(time.Millisecond)))
		}
	}
	// A run in which no transaction finished inside the window (a convoy
	// of waiters at SERIALIZABLE) prints no tps line: that is a
	// measurement of 0, not a failure of pgbench.
	none := reTxns.MatchString(out) && res.Transactions == 0
	if runErr != nil || res.Aborted || !reTPS.MatchString(out) && !none {
		return nil, res, fmt.Errorf("bench: pgbench %s: %v\n%s", strings.Join(args, " "), runErr, tailString(out, 3000))
	}

	logs, err := readPgbenchLogs(dir, r.rate > 0)
	if err != nil {
		return nil, res, err
	}
	lat, lag, late := logs.lat, logs.lag, logs.late
	window, rate := float64(secs), res.TPS
	switch {
	case r.txns > 0 && res.TPS > 0:
		window = float64(res.Transactions) / res.TPS
	case r.txns == 0 && r.rate == 0:
		var n int64
		window, n = logs.closedWindow(time.Duration(measured) * time.Second)
		if window > 0 {
			rate = float64(n) / window
		}
		res.Measured, res.InWindow = window, n
	}
	run := &Run{
		Loop: "closed", Clients: r.clients, Window: window,
		Goodput: rate, Throughput: rate,
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

// pgbenchSeconds is the -T of a closed-loop trial whose window is secs
// whole seconds, when connecting its clients takes connect.
//
// pgbench counts the time its clients take to connect against -T: 128
// clients on 2 cores took 1.1 s to connect, and -T 1 processed no
// transaction at all; its "tps without initial connection time" divides by
// the connecting time over the client count, so at 32 clients it counted
// the quarter second they took as measured. The goodput is counted from the
// pgbench log instead (closedWindow), over the part of the run where every
// client was in the loop, and -T grows by half again the time this client
// count takes to connect where that is more than a fifth of the window
// (below, the window is that much shorter, and measured). A tenth extended
// every 8-client trial by a whole second (pgbench runs whole seconds) for
// 0.1 s of connecting, 45 s of a full sweep on 2 cores; a quarter sat
// inside the spread of 32 clients' connecting (0.22 to 0.44 s), so one
// unloaded measurement under it ran a whole sweep's 32-client trials at
// -T 1 (connectTime now keeps the largest it saw). Leaving 0.6 of the
// window instead (-T 1 at 32 clients, 2 at 128) was tried on 2026-12-04 and
// dropped: the slow strategies' clients ran 1 to 6 transactions each in it
// (hotrow-serializable at 32 clients, 100 ms a transaction and retries),
// too few for a rate, and the 128-client points fell by half.
func pgbenchSeconds(secs int, connect time.Duration) int {
	if c := connect.Seconds(); c > float64(secs)/5 {
		secs += int(math.Ceil(1.5 * c))
	}
	return secs
}

// connectTime is how long pgbench takes to connect r.clients clients from
// threads threads, measured once per pair with a one-transaction run of
// SELECT 1 ("initial connection time"), then the largest of that and what
// every closed-loop run of the pair reported (sawConnect): connecting
// under load takes longer, and one low reading must not set every trial's
// -T.
func (p *Pgbench) connectTime(ctx context.Context, r pgbenchRun, threads int) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := [2]int{r.clients, threads}
	if d, ok := p.connect[key]; ok {
		return d, nil
	}
	_, res, err := p.run(ctx, pgbenchRun{dsn: r.dsn, script: "SELECT 1;\n", clients: r.clients, threads: threads, txns: 1})
	if err != nil {
		return 0, fmt.Errorf("bench: pgbench: time its connecting: %w", err)
	}
	if p.connect == nil {
		p.connect = map[[2]int]time.Duration{}
	}
	d := time.Duration(res.ConnectMs * float64(time.Millisecond))
	p.connect[key] = d
	return d, nil
}

// sawConnect raises the connecting time remembered for clients and threads
// to d if d is larger.
func (p *Pgbench) sawConnect(clients, threads int, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := [2]int{clients, threads}
	if old, ok := p.connect[key]; ok && d > old {
		p.connect[key] = d
	}
}

// pgbenchLogs is what the per-transaction logs of one run hold.
type pgbenchLogs struct {
	lat, lag *hdrhistogram.Histogram
	late     int64
	// firstStart is, per client whose first transaction succeeded, when
	// that transaction began; seen holds every client with a line; ends
	// is when each successful transaction ended (µs since the epoch).
	firstStart map[string]int64
	seen       map[string]bool
	ends       []int64
	// lastEnd is, per client, when its last transaction (failed ones
	// included) ended.
	lastEnd map[string]int64
}

// closedWindow is the closed loop's measured window: from the moment every
// client has begun its first transaction (pgbench connects its clients
// inside -T, then starts them together) for want, or until the first client
// stopped when that came earlier: the part of the run where every client
// was in the loop, as in the Go client's window. It returns the window in
// seconds and how many transactions ended inside it. A client whose first
// transaction failed (SERIALIZABLE, its tries exhausted) logged no latency,
// so when it began is unknown; it began with the others, and its first
// success, up to 0.6 s later under a queue of 32 (seen), would start the
// window late.
func (l *pgbenchLogs) closedWindow(want time.Duration) (float64, int64) {
	if len(l.ends) == 0 {
		return 0, 0
	}
	var from int64
	for _, t := range l.firstStart {
		from = max(from, t)
	}
	if len(l.firstStart) == 0 {
		from = slices.Min(l.ends) // every first transaction failed
	}
	// The window ends when the first client stopped: past -T, clients end
	// their last transaction one by one and the rate falls; counting that
	// tail understated pgbench by a fifth at 32 clients with -T 1.
	to := from + want.Microseconds()
	for _, t := range l.lastEnd {
		to = min(to, t)
	}
	if to <= from {
		return 0, 0
	}
	var n int64
	for _, t := range l.ends {
		if t > from && t <= to {
			n++
		}
	}
	return float64(to-from) / 1e6, n
}

// readPgbenchLogs reads pgbench's per-transaction logs (-l): one line per
// transaction, "client_id transaction_no time script_no time_epoch time_us
// [schedule_lag]", time in µs ("skipped" or "failed" instead of a number
// for those), time_epoch and time_us when it ended. With --rate, pgbench's
// time runs from the transaction's actual start; the latency recorded here
// adds its schedule lag, so that it runs from the planned start, as the Go
// open loop's does. late counts the transactions that started more than
// 1 ms after their planned time.
func readPgbenchLogs(dir string, withLag bool) (*pgbenchLogs, error) {
	files, err := filepath.Glob(filepath.Join(dir, "log.*"))
	if err != nil {
		return nil, err
	}
	l := &pgbenchLogs{lat: newHist(), firstStart: map[string]int64{}, seen: map[string]bool{}, lastEnd: map[string]int64{}}
	if withLag {
		l.lag = newHist()
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 6 {
				continue
			}
			// A client's lines are in one file, in the order its
			// transactions ran: its first line is its first transaction.
			client, first := fields[0], !l.seen[fields[0]]
			l.seen[client] = true
			sec, err1 := strconv.ParseInt(fields[4], 10, 64)
			frac, err2 := strconv.ParseInt(fields[5], 10, 64)
			end, endKnown := sec*1_000_000+frac, err1 == nil && err2 == nil
			if endKnown {
				l.lastEnd[client] = max(l.lastEnd[client], end)
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				continue // skipped or failed
			}
			if endKnown {
				l.ends = append(l.ends, end)
				if first {
					l.firstStart[client] = end - us
				}
			}
			if withLag && len(fields) >= 7 {
				if lg, err := strconv.ParseInt(fields[6], 10, 64); err == nil {
					record(l.lag, time.Duration(lg)*time.Microsecond)
					us += lg
					if lg > 1000 {
						l.late++
					}
				}
			}
			record(l.lat, time.Duration(us)*time.Microsecond)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
