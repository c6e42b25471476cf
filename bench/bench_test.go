package bench_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	_ "github.com/reservebench/reservebench/all"
	"github.com/reservebench/reservebench/bench"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// benchClients are the client counts of BenchmarkReserve.
var benchClients = []int{1, 4, 8, 32, 128}

// fsyncServer is the server of the benchmarks: started on first use with
// fsync on, as users run PostgreSQL (the tests' shared server has it off),
// and stopped when BenchmarkReserve ends.
var fsyncServer struct {
	once sync.Once
	srv  *pgtest.Server
	err  error
	dbs  map[string]*pgtest.Database
	res  map[string]resourcetest.Set // what each strategy needs besides PostgreSQL
	sku  int
}

// BenchmarkReserve measures each registered strategy's reserve path with
// testing.B: b.N reservations of a never-selling-out stock by N concurrent
// clients (a closed loop), on a PostgreSQL with fsync on, one fresh
// deployment per run. Besides ns/op (wall time per reservation, all clients
// together) it reports succ/s and the p50 and p99 latency of successes,
// read from the merged HDR histograms of the clients. The full sweep, with
// pgbench side by side, repeated trials and confidence intervals, is
// cmd/reservebench-bench (make bench).
//
//	go test -run '^$' -bench . ./bench
//	go test -run '^$' -bench 'Reserve/strategy=hotrow/' -count 5 ./bench | tee new.txt; benchstat -col /strategy new.txt
func BenchmarkReserve(b *testing.B) {
	fsyncServer.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		fsyncServer.srv, fsyncServer.err = pgtest.Start(ctx, pgtest.Options{Fsync: true})
		fsyncServer.dbs = map[string]*pgtest.Database{}
		fsyncServer.res = map[string]resourcetest.Set{}
	})
	if fsyncServer.err != nil {
		b.Fatal(fsyncServer.err)
	}
	b.Cleanup(func() {
		if fsyncServer.srv != nil {
			_ = fsyncServer.srv.Stop()
		}
		for _, set := range fsyncServer.res {
			_ = set.Close()
		}
	})
	metas := strategy.Registered()
	if len(metas) == 0 {
		b.Fatal("no strategy registered")
	}
	for _, m := range metas {
		for _, c := range benchClients {
			b.Run(fmt.Sprintf("strategy=%s/clients=%d", m.Name, c), func(b *testing.B) {
				benchmarkReserve(b, m, c)
			})
		}
	}
}

func benchmarkReserve(b *testing.B, m strategy.Meta, clients int) {
	ctx := context.Background()
	srv := fsyncServer.srv
	db, ok := fsyncServer.dbs[m.Name]
	if !ok {
		var err error
		if db, err = srv.CreateDatabase(ctx, "benchreserve"); err != nil {
			b.Fatal(err)
		}
		fsyncServer.dbs[m.Name] = db
	}
	cfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(clients)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	fsyncServer.sku++
	sku := fmt.Sprintf("b-%06d", fsyncServer.sku)
	res, ok := fsyncServer.res[m.Name]
	if !ok {
		if res, err = resourcetest.Start(ctx, m); err != nil {
			b.Fatal(err)
		}
		fsyncServer.res[m.Name] = res
	}
	dep, err := m.Open(ctx, strategy.Config{DB: pool, Stock: []strategy.Stock{{SKU: sku, Total: b.N + 1}}, Nodes: 1, Resources: res.Addrs()})
	if err != nil {
		b.Fatal(err)
	}
	defer dep.Close()
	// Connect every client's connection before the clock starts.
	conns := make([]*pgxpool.Conn, clients)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	load := bench.Load{Clients: clients, SKU: sku, KeyBase: int64(fsyncServer.sku) * 10_000 * bench.KeyStride}
	b.ResetTimer()
	run := bench.DriveN(ctx, dep.Node(0), load, b.N)
	b.StopTimer()
	// A refusal on a stock that cannot sell out is a broken strategy. An
	// error is an unknown outcome the contract allows: a strategy whose
	// retries are bounded (hotrow at REPEATABLE READ under contention)
	// gives up some requests, and that is a measurement, not a failure.
	if run.Held+run.Errors != int64(b.N) {
		b.Fatalf("%d of %d HELD, %d errors (first: %s), outcomes %v", run.Held, b.N, run.Errors, run.FirstErr, run.Outcomes)
	}
	if run.Errors > 0 {
		b.Logf("%d of %d requests ended in an error (unknown outcome), first: %s", run.Errors, b.N, run.FirstErr)
	}
	b.ReportMetric(float64(run.Errors)/float64(b.N), "errors/op")
	b.ReportMetric(run.Goodput, "succ/s")
	b.ReportMetric(run.HeldLatency.P50, "p50-ms")
	b.ReportMetric(run.HeldLatency.P99, "p99-ms")
}
