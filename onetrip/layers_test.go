package onetrip_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/bench"
	"github.com/reservebench/reservebench/onetrip"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// BenchmarkHeldPathLayers takes the Go client's HELD path apart one layer at
// a time: one client, one statement (onetrip's whole HELD path), the same
// server and database, so what one layer adds over the next is the client's
// own cost. Each reports cpu-µs/op, the client's user and system CPU per
// reservation (getrusage of this process; of pgbench's for layer=pgbench):
//
//	strategy  Node.Reserve: the request's checks, the node's sold-out hint, pgxpool, pgx
//	pool      pgxpool.Pool.QueryRow of the statement, scanning expires_at
//	conn      pgx.Conn.QueryRow, without the pool
//	pgconn    pgconn.PgConn.ExecPrepared: pgx's wire protocol alone (text
//	          parameters, nothing decoded)
//	pgbench   pgbench -M prepared -c 1 -t b.N running the deployment's own
//	          script (connection included, as the report counts it)
//
// On 2 cores the client's CPU is the server's loss, so a gap in cpu-µs/op
// is a gap in goodput at saturation (docs/performance-method.md, "Where the
// client time goes"). The tests' server has fsync off: client CPU does not
// depend on it, wall time (ns/op) does, so ns/op here is not the report's.
// -cpu 1 matches the report's one-client point (GOMAXPROCS as pgbench -j):
//
//	go test -run '^$' -bench HeldPathLayers -cpu 1 -count 6 ./onetrip | tee l.txt; benchstat -col /layer l.txt
func BenchmarkHeldPathLayers(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDatabase(b)
	pool := db.Pool(b, 1)
	sku := newSKU()
	m, ok := strategy.Lookup(onetrip.Name)
	if !ok {
		b.Fatalf("%s is not registered", onetrip.Name)
	}
	dep, err := m.Open(ctx, strategy.Config{DB: pool, Stock: []strategy.Stock{{SKU: sku, Total: 1 << 30}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = dep.Close() })
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	const prepared = "held_path"
	if _, err := conn.Prepare(ctx, prepared, onetrip.SQLInsertAndTake); err != nil {
		b.Fatal(err)
	}
	ttl := time.Hour
	keys := int64(0)
	next := func() string { keys++; return strconv.FormatInt(keys, 10) }

	layers := []struct {
		name string
		run  func(b *testing.B) time.Duration // the client's CPU over b.N reservations
	}{
		{"strategy", func(b *testing.B) time.Duration {
			node := dep.Node(0)
			return ownCPU(b, func() error {
				k := next()
				res, err := node.Reserve(ctx, strategy.Request{Key: k, User: k, SKU: sku, TTL: ttl})
				if err == nil && res.Outcome != strategy.OutcomeHeld {
					err = fmt.Errorf("%s, not HELD", res.Outcome)
				}
				return err
			})
		}},
		{"pool", func(b *testing.B) time.Duration {
			return ownCPU(b, func() error { return heldRow(ctx, pool, next(), sku, ttl) })
		}},
		{"conn", func(b *testing.B) time.Duration {
			return ownCPU(b, func() error { return heldRow(ctx, conn, next(), sku, ttl) })
		}},
		{"pgconn", func(b *testing.B) time.Duration {
			pc, us := conn.PgConn(), []byte(strconv.FormatInt(ttl.Microseconds(), 10))
			return ownCPU(b, func() error {
				k := []byte(next())
				_, err := pc.ExecPrepared(ctx, prepared, [][]byte{k, k, []byte(sku), us}, nil, nil).Close()
				return err
			})
		}},
		{"pgbench", func(b *testing.B) time.Duration {
			return pgbenchCPU(b, dep, db.DSN, sku, &keys)
		}},
	}
	for _, l := range layers {
		b.Run("layer="+l.name, func(b *testing.B) {
			cpu := l.run(b)
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var _ rowQuerier = (*pgxpool.Pool)(nil)

func heldRow(ctx context.Context, q rowQuerier, key, sku string, ttl time.Duration) error {
	var expires time.Time
	return q.QueryRow(ctx, onetrip.SQLInsertAndTake, key, key, sku, ttl.Microseconds()).Scan(&expires)
}

// ownCPU runs reserve b.N times under the benchmark's timer and returns
// this process's CPU time over them.
func ownCPU(b *testing.B, reserve func() error) time.Duration {
	if err := reserve(); err != nil { // statement cache and connection warm
		b.Fatal(err)
	}
	b.ResetTimer()
	before := processCPU()
	for range b.N {
		if err := reserve(); err != nil {
			b.Fatal(err)
		}
	}
	cpu := processCPU() - before
	b.StopTimer()
	return cpu
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pgbenchCPU runs the deployment's pgbench script b.N times on one client
// and returns pgbench's CPU time; its keys start above every key the other
// layers used.
func pgbenchCPU(b *testing.B, dep strategy.Deployment, dsn, sku string, keys *int64) time.Duration {
	scripter, ok := dep.(bench.PgbenchScripter)
	if !ok {
		b.Fatalf("%T has no pgbench script", dep)
	}
	script, err := scripter.PgbenchScript(sku)
	if err != nil {
		b.Fatal(err)
	}
	p, err := bench.FindPgbench(pgtest.Shared(b).BinDir())
	if err != nil {
		b.Skip(err)
	}
	file := filepath.Join(b.TempDir(), "held.sql")
	if err := os.WriteFile(file, []byte(bench.PgbenchPrologue+script), 0o644); err != nil {
		b.Fatal(err)
	}
	base := *keys + 1
	*keys += int64(b.N) + 1
	b.ResetTimer()
	cmd := exec.Command(p.Path, "-n", "-M", "prepared", "-c", "1", "-j", "1", "-t", strconv.Itoa(b.N),
		"-D", "n=0", "-D", "base="+strconv.FormatInt(base, 10), "-D", "sku="+sku,
		"-D", "ttl_us="+strconv.FormatInt(time.Hour.Microseconds(), 10), "-f", file, dsn)
	out, err := cmd.CombinedOutput()
	b.StopTimer()
	if err != nil {
		b.Fatalf("pgbench: %v\n%s", err, out)
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}
