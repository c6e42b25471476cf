package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// Tool says who sends the requests of a trial.
type Tool string

// The tools.
const (
	ToolGo      Tool = "go"      // the strategy's Go code, Node(0).Reserve, through pgx
	ToolPgbench Tool = "pgbench" // the strategy's pgbench script: the same SQL without the Go code
	// ToolHTTP: the same Go load generator as ToolGo, but every request is
	// an HTTP request to package service's handler over Node(0), on a
	// loopback socket (HTTPFront): what the HTTP layer adds to the library.
	ToolHTTP Tool = "http"
)

// Env is where trials run: one PostgreSQL server, one database per
// strategy (created on first use, so tables of one strategy never slow
// another), and a superuser connection to the "postgres" database for the
// counters.
type Env struct {
	Server  *pgtest.Server
	Pgbench *Pgbench // nil: no pgbench trials

	mu     sync.Mutex
	admin  *pgx.Conn
	dbs    map[string]*pgtest.Database
	res    map[string]resourcetest.Set // per strategy: what it needs besides PostgreSQL
	serial int64
}

// NewEnv prepares trials on srv. pgbench is looked up beside the server's
// binaries; without it pgbench trials fail and Go trials run.
func NewEnv(ctx context.Context, srv *pgtest.Server) (*Env, error) {
	admin, err := pgx.Connect(ctx, srv.AdminDSN("postgres"))
	if err != nil {
		return nil, fmt.Errorf("bench: connect admin: %w", err)
	}
	e := &Env{Server: srv, admin: admin, dbs: map[string]*pgtest.Database{}, res: map[string]resourcetest.Set{}}
	if pb, err := FindPgbench(srv.BinDir()); err == nil {
		e.Pgbench = pb
	}
	return e, nil
}

// Close drops the databases the Env created and closes its connection.
func (e *Env) Close(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	for _, db := range e.dbs {
		errs = append(errs, e.Server.DropDatabase(ctx, db.Name))
	}
	e.dbs = map[string]*pgtest.Database{}
	for _, set := range e.res {
		errs = append(errs, set.Close())
	}
	e.res = map[string]resourcetest.Set{}
	errs = append(errs, e.admin.Close(ctx))
	return errors.Join(errs...)
}

// Resources returns what strategy m needs besides PostgreSQL (its Redis),
// started on first use (package resourcetest) and kept for the Env's life.
func (e *Env) Resources(ctx context.Context, m strategy.Meta) (resourcetest.Set, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if set, ok := e.res[m.Name]; ok {
		return set, nil
	}
	set, err := resourcetest.Start(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("bench: resources for %s: %w", m.Name, err)
	}
	e.res[m.Name] = set
	return set, nil
}

// Database returns the database of one strategy, creating it on first use.
func (e *Env) Database(ctx context.Context, strategyName string) (*pgtest.Database, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if db, ok := e.dbs[strategyName]; ok {
		return db, nil
	}
	db, err := e.Server.CreateDatabase(ctx, "bench")
	if err != nil {
		return nil, err
	}
	e.dbs[strategyName] = db
	return db, nil
}

// Settings reads server settings for the report.
func (e *Env) Settings(ctx context.Context, names ...string) (map[string]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]string, len(names))
	for _, n := range names {
		var v string
		if err := e.admin.QueryRow(ctx, `SELECT current_setting($1)`, n).Scan(&v); err != nil {
			return nil, fmt.Errorf("bench: setting %s: %w", n, err)
		}
		out[n] = v
	}
	return out, nil
}

func (e *Env) next() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.serial++
	return e.serial
}

// Spec is one trial.
type Spec struct {
	Meta strategy.Meta
	Tool Tool
	// Control names a control script of the deployment
	// (PgbenchControlScripter) to run instead of the reservation; pgbench only.
	Control string
	// Clients: concurrent clients (Go) or pgbench -c.
	Clients int
	// Duration of the measured window; pgbench runs whole seconds.
	Duration time.Duration
	// Transactions > 0 makes pgbench run this many transactions per client
	// (-t) instead of Duration: for tests of the scripts.
	Transactions int
	// Stock is the number of units of the trial's SKU. Every trial opens a
	// fresh deployment with a SKU of its own.
	Stock int
	// SKUs > 1 spreads the requests over that many SKUs of the trial's own
	// with Zipf-distributed popularity (Load.SKUs, Load.Zipf), SKU i with
	// ceil(2 * Stock * share(i)) + 20 units: twice its expected share of a
	// never-sells-out stock, and a few for the tail. Go only.
	SKUs int
	Zipf float64
	// Rate > 0 runs an open loop at this many requests per second
	// (Load.Rate, pgbench --rate); LateLimit and MaxInFlight as in Load.
	// Clients is then the size of the Go pool (the connections the
	// requests in flight share) and pgbench's -c.
	Rate        float64
	LateLimit   time.Duration
	MaxInFlight int
	// Admission, when set, puts an admission.Gate with these limits in front
	// of the node (Go and HTTP), and sizes the pool to InFlight
	// connections. Without it an HTTP trial's service still has its gate
	// (the service always asks one), with as many slots as requests can be
	// in flight, so it never refuses and never queues: what is measured is
	// the HTTP layer, not admission.
	Admission *admission.Limits
	// SampleEvery is the wait-event sampling period (0: no sampling).
	SampleEvery time.Duration
	// Progress receives progress lines (Go: every ProgressEvery; pgbench:
	// its -P 1 lines).
	Progress      func(string)
	ProgressEvery time.Duration
	// Seed of an open loop's schedule.
	Seed uint64
	// CPUProfile, when set, receives a CPU profile (runtime/pprof) of this
	// process while the Go client runs: what the client's time goes to.
	CPUProfile io.Writer
}

// Trial is the result of one Spec.
type Trial struct {
	Strategy  string            `json:"strategy"`
	Tool      Tool              `json:"tool"`
	Control   string            `json:"control,omitempty"`
	Clients   int               `json:"clients"`
	Stock     int               `json:"stock"`
	Admission *admission.Limits `json:"admission,omitempty"`
	SKU       string            `json:"sku"`
	SKUs      int               `json:"skus,omitempty"` // > 1: requests spread over this many SKUs (Spec.SKUs)
	Started   time.Time         `json:"started"`
	Run       *Run              `json:"run"`
	Cost      Cost              `json:"cost"`
	PerHeld   PerSuccess        `json:"per_success"`
	Waits     *Waits            `json:"waits,omitempty"`
	Gate      *admission.Stats  `json:"gate,omitempty"`
	Pgbench   *PgbenchResult    `json:"pgbench,omitempty"`
	// HTTPConns is the number of connections the service accepted in a
	// ToolHTTP trial: the clients' keep-alive pool, plus any it had to
	// open again.
	HTTPConns int64 `json:"http_conns,omitempty"`
	// Audit is the deployment's conservation audit after the trial, summed
	// over its SKUs. For pgbench trials of strategies that count in memory,
	// only Active (rows the script wrote) means anything.
	Audit strategy.StockAudit `json:"audit"`
	// Retries are the transactions the deployment ran again (Retrier), and
	// Batches its batches (BatchCounter), when it counts them; Go only.
	Retries *int64       `json:"retries,omitempty"`
	Batches *BatchCounts `json:"batches,omitempty"`
	// SoldOut: a stock meant never to sell out did (some request was
	// answered SOLD_OUT, or pgbench made as many reservations as there were
	// units). Such a trial is not a never-sells-out measurement.
	SoldOut bool `json:"sold_out"`
}

// Retrier is implemented by deployments that count the transactions they
// ran again after PostgreSQL refused them (hotrow's Retries).
type Retrier interface{ Retries() int64 }

// BatchCounter is implemented by deployments that serve requests in
// batches (combine): how many batches since Open, how many requests they
// carried, and the most one carried.
type BatchCounter interface {
	BatchCounts() (batches, requests, largest int64)
}

// BatchCounts is a trial's BatchCounter reading.
type BatchCounts struct {
	Batches  int64 `json:"batches"`
	Requests int64 `json:"requests"`
	Largest  int64 `json:"largest"`
}

// RunTrial opens a fresh deployment of spec.Meta with a SKU of its own,
// runs the load with the tool, and measures it. The sequence, for both
// tools: open the deployment; close every connection (their statistics are
// then reported); connect the clients; read the counters; run (sampling
// pg_stat_activity); close every connection again and wait until the
// server has none; read the counters; audit.
func (e *Env) RunTrial(ctx context.Context, spec Spec) (*Trial, error) {
	if spec.Clients < 1 {
		return nil, fmt.Errorf("bench: %d clients", spec.Clients)
	}
	db, err := e.Database(ctx, spec.Meta.Name)
	if err != nil {
		return nil, err
	}
	serial := e.next()
	sku := fmt.Sprintf("bench-%06d", serial)
	t := &Trial{Strategy: spec.Meta.Name, Tool: spec.Tool, Control: spec.Control, Clients: spec.Clients,
		Stock: spec.Stock, Admission: spec.Admission, SKU: sku, Started: time.Now()}
	load := Load{Clients: spec.Clients, Duration: spec.Duration, SKU: sku, KeyBase: serial * 10_000 * KeyStride,
		Rate: spec.Rate, LateLimit: spec.LateLimit, MaxInFlight: spec.MaxInFlight, Seed: spec.Seed + uint64(serial)}
	stock := []strategy.Stock{{SKU: sku, Total: spec.Stock}}
	if spec.SKUs > 1 {
		if spec.Tool == ToolPgbench {
			return nil, errors.New("bench: many SKUs run with the Go client only")
		}
		t.SKUs = spec.SKUs
		stock = stock[:0]
		for i, share := range ZipfShares(spec.SKUs, spec.Zipf) {
			name := fmt.Sprintf("%s-%04d", sku, i)
			load.SKUs = append(load.SKUs, name)
			stock = append(stock, strategy.Stock{SKU: name, Total: int(math.Ceil(2*float64(spec.Stock)*share)) + 20})
		}
		load.Zipf = spec.Zipf
	}

	poolSize := spec.Clients
	if spec.Tool == ToolPgbench {
		poolSize = 2 // Open and Audit only
	} else if spec.Admission != nil && spec.Admission.InFlight < poolSize {
		poolSize = spec.Admission.InFlight
	}
	trips := &roundTrips{}
	pool, err := newPool(ctx, db.DSN, poolSize, trips)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	res, err := e.Resources(ctx, spec.Meta)
	if err != nil {
		return nil, err
	}
	dep, err := spec.Meta.Open(ctx, strategy.Config{DB: pool, Stock: stock, Nodes: 1, Resources: res.Addrs()})
	if err != nil {
		return nil, fmt.Errorf("bench: open %s: %w", spec.Meta.Name, err)
	}
	defer dep.Close()

	var script string
	if spec.Tool == ToolPgbench {
		if script, err = pgbenchScript(dep, spec.Control, sku); err != nil {
			return nil, err
		}
		if e.Pgbench == nil {
			return nil, errors.New("bench: no pgbench binary")
		}
	} else if spec.Control != "" {
		return nil, errors.New("bench: control scripts run with pgbench only")
	}

	// Every connection that did setup work goes, so that its statistics are
	// reported before the first reading.
	pool.Reset()
	if err := e.quiet(ctx, db.Name); err != nil {
		return nil, err
	}
	if spec.Tool != ToolPgbench {
		if err := warm(ctx, pool, poolSize); err != nil {
			return nil, err
		}
	}
	trips.queries.Store(0)
	trips.prepares.Store(0)
	before, err := e.counters(ctx, db.Name)
	if err != nil {
		return nil, err
	}
	redisCount, err := startRedisCounter(ctx, res)
	if err != nil {
		return nil, err
	}
	var smp *sampler
	if spec.SampleEvery > 0 {
		if smp, err = startSampler(ctx, e.Server.AdminDSN("postgres"), db.Name, spec.SampleEvery); err != nil {
			return nil, err
		}
	}

	var front *HTTPFront
	if spec.Tool == ToolHTTP {
		if front, err = startFront(ctx, spec, dep.Node(0)); err != nil {
			if smp != nil {
				smp.finish()
			}
			return nil, err
		}
		// However the trial ends, the listener and the server stop.
		defer front.Close()
	}

	switch spec.Tool {
	case ToolGo, ToolHTTP:
		var s strategy.Strategy = dep.Node(0)
		var gate *admission.Gate
		if front != nil {
			s, gate = front.Node(), front.Gate
		} else if spec.Admission != nil {
			if gate, err = admission.New(s, *spec.Admission); err != nil {
				return nil, err
			}
			s = gate
		}
		if spec.Progress != nil && spec.ProgressEvery > 0 {
			load.Progress = func(tk Tick) {
				spec.Progress(fmt.Sprintf("progress: %.1f s, %.1f succ/s, lat %.3f ms (successes)",
					tk.Elapsed.Seconds(), tk.HeldRate, float64(tk.MeanLatency)/float64(time.Millisecond)))
			}
			load.ProgressEvery = spec.ProgressEvery
		}
		// As testing.B does before each run: the garbage that earlier trials
		// and this one's set-up left (per-client histograms once merged,
		// the buffers of closed connections) is collected now, not by a
		// cycle that lands in the window and takes the client's thread (at
		// one client, GOMAXPROCS is 1).
		runtime.GC()
		if spec.CPUProfile != nil {
			if err := pprof.StartCPUProfile(spec.CPUProfile); err != nil {
				return nil, fmt.Errorf("bench: cpu profile: %w", err)
			}
		}
		restore := useClientThreads(spec.Clients)
		t.Run = Drive(ctx, s, load)
		restore()
		if spec.CPUProfile != nil {
			pprof.StopCPUProfile()
		}
		if front != nil {
			// Every answer has arrived (Drive waits for them), so every
			// handler has finished its database work; stop the server
			// before the connections are counted and closed.
			if err := front.Close(); err != nil {
				if smp != nil {
					smp.finish()
				}
				return nil, err
			}
			t.HTTPConns = front.Accepted()
		}
		if gate != nil {
			st := gate.Stats()
			t.Gate = &st
		}
	case ToolPgbench:
		vars := map[string]string{
			"n":      "0",
			"base":   strconv.FormatInt(load.KeyBase, 10),
			"sku":    sku,
			"ttl_us": strconv.FormatInt(strategy.TTLForever.Microseconds(), 10),
		}
		tries := 0
		if pr, ok := dep.(PgbenchRetrier); ok && spec.Control == "" {
			tries = pr.PgbenchMaxTries()
		}
		t.Run, t.Pgbench, err = e.Pgbench.run(ctx, pgbenchRun{
			dsn: db.DSN, script: PgbenchPrologue + script, vars: vars,
			clients: spec.Clients, threads: clientThreads(spec.Clients), duration: spec.Duration, txns: spec.Transactions,
			rate: spec.Rate, lateLimit: spec.LateLimit, maxTries: tries, progress: spec.Progress,
		})
		if err != nil {
			if smp != nil {
				smp.finish()
			}
			return nil, err
		}
	default:
		return nil, fmt.Errorf("bench: unknown tool %q", spec.Tool)
	}
	if smp != nil {
		t.Waits = smp.finish()
	}

	pool.Reset()
	if err := e.quiet(ctx, db.Name); err != nil {
		return nil, err
	}
	after, err := e.counters(ctx, db.Name)
	if err != nil {
		return nil, err
	}
	t.Cost = after.since(before)
	t.Cost.Queries, t.Cost.Prepares = trips.queries.Load(), trips.prepares.Load()
	if t.Cost.RedisCommands, err = redisCount.since(ctx); err != nil {
		return nil, err
	}
	if spec.Tool != ToolPgbench {
		t.Cost.PoolConns = poolSize
	}
	if t.Waits != nil {
		t.Cost.Connections = t.Waits.MaxBackends
	}
	t.PerHeld = t.Cost.Per(t.Run.HeldTotal)

	audits, err := dep.Audit(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: audit: %w", err)
	}
	for _, a := range audits {
		t.Audit.Total += a.Total
		t.Audit.Available += a.Available
		t.Audit.Active += a.Active
	}
	t.Audit.SKU = sku
	if spec.Tool != ToolPgbench {
		if r, ok := dep.(Retrier); ok {
			n := r.Retries()
			t.Retries = &n
		}
		if b, ok := dep.(BatchCounter); ok {
			var c BatchCounts
			c.Batches, c.Requests, c.Largest = b.BatchCounts()
			t.Batches = &c
		}
	}
	t.SoldOut = t.Run.Outcomes[string(strategy.OutcomeSoldOut)] > 0 ||
		(spec.Tool == ToolPgbench && t.Audit.Active >= spec.Stock)
	return t, nil
}

func pgbenchScript(dep strategy.Deployment, control, sku string) (string, error) {
	if control != "" {
		cs, ok := dep.(PgbenchControlScripter)
		if !ok {
			return "", fmt.Errorf("bench: deployment %T has no control scripts", dep)
		}
		scripts, err := cs.PgbenchControls(sku)
		if err != nil {
			return "", err
		}
		s, ok := scripts[control]
		if !ok {
			return "", fmt.Errorf("bench: no control script %q", control)
		}
		return s, nil
	}
	ps, ok := dep.(PgbenchScripter)
	if !ok {
		return "", fmt.Errorf("bench: deployment %T has no pgbench script", dep)
	}
	return ps.PgbenchScript(sku)
}

func (e *Env) quiet(ctx context.Context, database string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return waitNoBackends(ctx, e.admin, database)
}

func (e *Env) counters(ctx context.Context, database string) (counters, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return readCounters(ctx, e.admin, database)
}

// startFront serves node over HTTP for an HTTP trial. The client keeps a
// connection per client of a closed loop, and up to the cap of requests in
// flight for an open loop (HTTP/1.1 carries one request at a time per
// connection); the connections the library path would have warm (its pool:
// Clients) are connected before the window.
func startFront(ctx context.Context, spec Spec, node strategy.Strategy) (*HTTPFront, error) {
	conns := spec.Clients
	var work time.Duration
	if spec.Rate > 0 {
		conns = spec.MaxInFlight
		if conns <= 0 {
			conns = DefaultMaxInFlight
		}
		// The open loop cancels its requests OpenGrace after the window, but
		// the service finishes what it admitted: bound that work instead. A
		// request answered inside the window worked less than the window, so
		// this cuts only work that nothing counts (up to 11 s of draining an
		// HTTP trial on 2 cores).
		work = spec.Duration + OpenGrace
	}
	limits := admission.Limits{InFlight: conns}
	if spec.Admission != nil {
		limits = *spec.Admission
		conns = max(conns, spec.Admission.InFlight+spec.Admission.Queue)
	}
	return StartHTTPFront(ctx, HTTPFrontConfig{Node: node, Name: spec.Meta.Name, Limits: limits,
		Conns: conns, Warm: spec.Clients, Quiet: spec.Duration + 10*time.Second, WorkTimeout: work})
}

// newPool opens a pool of exactly size connections (once warmed) whose
// round trips trips counts.
func newPool(ctx context.Context, dsn string, size int, trips *roundTrips) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("bench: parse dsn: %w", err)
	}
	cfg.MaxConns = int32(size)
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: open pool: %w", err)
	}
	return pool, nil
}

// warm connects every connection of the pool before the clock starts:
// connection set-up is not part of a reservation (pgbench excludes it too).
func warm(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conns[i], errs[i] = pool.Acquire(ctx)
		}()
	}
	wg.Wait()
	for _, c := range conns {
		if c != nil {
			c.Release()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: warm pool: %w", err)
	}
	return nil
}

// Caps is what a strategy's deployment offers the bench beyond Reserve.
type Caps struct {
	// Pgbench: a pgbench script (PgbenchScripter).
	Pgbench bool
	// LeavesOut: what that script leaves out of the Go path
	// (PgbenchPartial); empty when it is the whole HELD path.
	LeavesOut string
	// Controls: the control scripts (PgbenchControlScripter), sorted.
	Controls []string
}

// Capabilities opens a one-unit deployment of m and asks it what it offers.
func (e *Env) Capabilities(ctx context.Context, m strategy.Meta) (Caps, error) {
	var c Caps
	db, err := e.Database(ctx, m.Name)
	if err != nil {
		return c, err
	}
	pool, err := newPool(ctx, db.DSN, 2, &roundTrips{})
	if err != nil {
		return c, err
	}
	defer pool.Close()
	res, err := e.Resources(ctx, m)
	if err != nil {
		return c, err
	}
	sku := fmt.Sprintf("caps-%06d", e.next())
	dep, err := m.Open(ctx, strategy.Config{DB: pool, Stock: []strategy.Stock{{SKU: sku, Total: 1}}, Nodes: 1, Resources: res.Addrs()})
	if err != nil {
		return c, fmt.Errorf("bench: open %s: %w", m.Name, err)
	}
	defer dep.Close()
	if ps, ok := dep.(PgbenchScripter); ok {
		if _, err := ps.PgbenchScript(sku); err == nil {
			c.Pgbench = true
		}
	}
	if pp, ok := dep.(PgbenchPartial); ok && c.Pgbench {
		c.LeavesOut = pp.PgbenchLeavesOut()
	}
	if cs, ok := dep.(PgbenchControlScripter); ok {
		scripts, err := cs.PgbenchControls(sku)
		if err == nil {
			for name := range scripts {
				c.Controls = append(c.Controls, name)
			}
			sort.Strings(c.Controls)
		}
	}
	return c, nil
}
