package redislock

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// Name is the name the strategy registers under.
const Name = "redislock"

func init() { strategy.Register(Meta()) }

// The seed's lock: wait up to 3 s, else 429; no lease time, so the
// watchdog renews a 30 s lease every 10 s.
const (
	DefaultWait  = 3 * time.Second
	DefaultLease = 30 * time.Second
	// DefaultPoll is how often a waiting take asks again (bsm/redislock
	// polls; Redisson waits on a pub/sub message instead).
	DefaultPoll = 2 * time.Millisecond
)

// Claims are redislock's: those of strategy A, whose conditional UPDATE it
// keeps as its last line. It does not claim strategy.NoWait: a request
// waits for the SKU's lock (in Redis) while another holds it.
const Claims = strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser | strategy.ReturnOnce |
	strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart

// Options configure the strategy. The zero value is the registered one,
// the seed's settings.
type Options struct {
	// Wait bounds how long a reservation waits for the SKU's lock before it
	// answers BUSY (0: DefaultWait).
	Wait time.Duration
	// Lease is the lock's TTL, renewed by the watchdog every third of it
	// while the work runs (0: DefaultLease).
	Lease time.Duration
	// LockOnly drops the database's condition: the UPDATE has no
	// available > 0 and the table no CHECK, so the lock alone decides, as
	// in designs that trust it. It is unsafe and exists only so that the
	// harness can show that the lock is not the guarantee (the negative
	// control ctl-lock-only). Its tables are its own
	// (redislock_lockonly_*), and so are its lock keys.
	LockOnly bool
	// Mistake is a deliberate mistake, for the negative controls of table
	// 28-1 only (package compare): each passed every scenario until the
	// lock faults checked what it breaks. NoMistake, the zero value, is
	// the strategy.
	Mistake Mistake
}

// Mistake names a deliberate mistake of Options.Mistake.
type Mistake int

const (
	NoMistake Mistake = iota
	// UnlockByDelete: the unlock deletes the lock's key without comparing
	// its token, so a holder whose lease expired deletes the lock its
	// successor holds.
	UnlockByDelete
	// ConditionInCheckOnly: the UPDATE has no available > 0, and only the
	// table's CHECK refuses an oversell: as an error, where the strategy
	// answers SOLD_OUT.
	ConditionInCheckOnly
	// UnlockErrorIsBusy: a request whose unlock failed after its COMMIT
	// (Redis stopped answering) is answered BUSY, which tells its client
	// that nothing was written, though its reservation is.
	UnlockErrorIsBusy
	// BusyWhenLost: a request whose watchdog found its lock taken by
	// another while it worked is answered BUSY after its COMMIT ("the
	// answer cannot be trusted: try again").
	BusyWhenLost
	// WaitIsSoldOut: a request whose lock was not granted within the wait
	// is answered SOLD_OUT ("a queue that long means the SKU is gone"),
	// while the holder may yet roll back or units remain.
	WaitIsSoldOut
	// SessionRelocks: every attempt of a session takes the SKU's lock, as a
	// plain request does, also when its own session holds it: the second
	// unit of one SKU in one session waits for itself until its bound and
	// answers BUSY.
	SessionRelocks
	// DoubleCheckStockOnly: the double check under the lock answers
	// SOLD_OUT when no unit is left without looking the key up again
	// (redislock until 2026-12-06): a twin that waited for the lock while
	// the first request committed the last unit is told SOLD_OUT, though
	// its own reservation holds the unit.
	DoubleCheckStockOnly
	// PreCheckStockOnly: the unlocked pre-check answers SOLD_OUT when it
	// reads no unit left without looking the key up again: a twin that read
	// its key before the first request committed the last unit, and the
	// stock after, is told SOLD_OUT, though its own reservation holds the
	// unit (outsider round 29's rl1).
	PreCheckStockOnly
	// GoneAfterCommitIsBusy: a request whose caller gave up by the time
	// its COMMIT and its unlock are done is answered BUSY ("the caller
	// left: try again"), though its reservation is written (outsider round
	// 40's m6).
	GoneAfterCommitIsBusy
	// SetFromCheck: under the lock the double check's read is taken as
	// the truth, and the UPDATE writes available = <that read> - 1 (with
	// its condition): when two holders overlap (an early unlock, an
	// expired lease, an emptied Redis), the second writes the first's
	// decrement again, and two reservations take one unit (outsider round
	// 40's m5).
	SetFromCheck
	// PreCheckUser: the unlocked pre-check, right after the key, answers
	// USER_LIMIT when the user holds the SKU, without looking the key up
	// again ("spare the lock a request it would refuse"): a twin that read
	// its key before the first request committed, and the user's
	// reservations after, is told USER_LIMIT about its own reservation
	// (outsider round 45's m08).
	PreCheckUser
	// LastUnitWaitSoldOut: a request that read one unit left or none
	// before the lock, and then had to wait for it, answers SOLD_OUT (its
	// key looked up first): "I queued behind the last unit's buyer". A
	// phantom whenever that buyer rolls back or takes nothing (outsider
	// round 45's m13).
	LastUnitWaitSoldOut
	// AbandonByDelete: a take given up (its wait bound passed, its caller
	// gone, Redis's error) deletes the SKU's lock by DEL, not by its
	// token: it frees the SKU under the holder still at work (outsider
	// round 45's m09).
	AbandonByDelete
	// LockWaitSticky: the strategy.LockWait of a request that waited for
	// the lock is never cleared: it says "waiting" after the lock is taken
	// and after the answer, and the kit goes on too soon (outsider round
	// 45's m01).
	LockWaitSticky
)

func (o Options) wait() time.Duration {
	if o.Wait > 0 {
		return o.Wait
	}
	return DefaultWait
}

// leaseFor is the lease of a deployment over cfg: the config's LockLease
// when it sets one, as the kit does to meet a lost lock within a check.
func (o Options) leaseFor(cfg strategy.Config) time.Duration {
	if cfg.LockLease > 0 {
		return cfg.LockLease
	}
	return o.lease()
}

func (o Options) lease() time.Duration {
	if o.Lease > 0 {
		return o.Lease
	}
	return DefaultLease
}

func (o Options) prefix() string {
	if o.LockOnly {
		return "redislock_lockonly"
	}
	return "redislock"
}

// Meta is the registered strategy: the seed's settings.
func Meta() strategy.Meta { return New(Options{}) }

// New describes the strategy with these options; it is not registered. A
// LockOnly variant is named "redislock-lock-only".
func New(opts Options) strategy.Meta {
	name := Name
	if opts.LockOnly {
		name += "-lock-only"
	}
	return strategy.Meta{
		Name:        name,
		Description: "per-SKU Redis lock (SET NX PX, watchdog, compare-and-delete), double check inside it, then the conditional UPDATE",
		Correctness: "the conditional UPDATE under PostgreSQL's row lock; the Redis lock only queues the buyers of a SKU",
		Claims:      Claims,
		Isolation:   "read committed",
		Retry:       "none in PostgreSQL: the conditional UPDATE re-evaluates under the row lock; the Redis lock is polled until it is free or the wait bound (3 s by default) passes, then BUSY",
		Needs:       []strategy.Need{{Resource: strategy.Redis}},
		Open:        pgstrategy.Bind(Open, opts),
		Attach:      pgstrategy.Bind(attach, opts),
	}
}

//go:embed schema.sql
var schemaSQL string

// tables are the deployment's table names and the statements over them.
type tables struct {
	prefix string
	schema pgstrategy.Schema
	moves  pgstrategy.StockRow
}

func tablesFor(opts Options) tables {
	p := opts.prefix()
	check := ",\n  CHECK (available >= 0 AND available <= total)"
	lockKey := int64(0x726c6f636b) // "rlock"
	if opts.LockOnly {
		check, lockKey = "", lockKey+1
	}
	ddl := strings.NewReplacer("{p}", p, "{check}", check).Replace(schemaSQL)
	return tables{prefix: p, moves: pgstrategy.NewStockRow(Name, p), schema: pgstrategy.Schema{
		DDL:     ddl,
		Last:    p + "_one_active",
		LockKey: lockKey,
		Totals:  fmt.Sprintf(`SELECT sku, total FROM %s_stock WHERE sku = ANY($1)`, p),
	}}
}

// q fills {p} in a statement.
func (t tables) q(sql string) string { return strings.ReplaceAll(sql, "{p}", t.prefix) }

const sqlInsertStock = `
INSERT INTO {p}_stock (sku, total, available)
SELECT sku, total, total FROM unnest($1::text[], $2::int[]) AS s (sku, total)
ON CONFLICT (sku) DO NOTHING
RETURNING sku`

// Open creates the schema if needed and loads the stock in one
// transaction (strategy.ErrStockExists if a SKU has stock), after checking
// that the Redis of cfg.Resources answers.
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rdb, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	tb := tablesFor(opts)
	err = tb.schema.Load(ctx, cfg, func(tx pgx.Tx) error {
		skus, totals := make([]string, len(cfg.Stock)), make([]int32, len(cfg.Stock))
		for i, s := range cfg.Stock {
			skus[i], totals[i] = s.SKU, int32(s.Total)
		}
		rows, err := tx.Query(ctx, tb.q(sqlInsertStock), skus, totals)
		if err != nil {
			return fmt.Errorf("insert stock: %w", err)
		}
		return pgstrategy.AllInserted(rows, skus)
	})
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("%s: open: %w", Name, err)
	}
	return newDeployment(cfg, opts, tb, rdb), nil
}

// attach is Meta.Attach: it checks the stock another process loaded and
// that Redis answers, and writes nothing.
func attach(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tb := tablesFor(opts)
	if err := tb.schema.Attach(ctx, cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	rdb, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return newDeployment(cfg, opts, tb, rdb), nil
}

// connect opens a client on the Redis of cfg and checks that it answers.
func connect(ctx context.Context, cfg strategy.Config) (*redis.Client, error) {
	addr, err := cfg.Resource(strategy.Redis)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	opt, err := redis.ParseURL(addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: redis address %q: %v", Name, strategy.ErrConfig, addr, err)
	}
	// A Redis that is down must cost a request little: one quick retry,
	// short timeouts, then BUSY.
	opt.MaxRetries = 1
	opt.DialerRetries = 1 // go-redis's default, 5 dials 100 ms apart, makes a down Redis cost 0.5 s a call
	opt.DialTimeout = time.Second
	opt.ReadTimeout = 2 * time.Second
	opt.WriteTimeout = 2 * time.Second
	opt.PoolSize = 64
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("%s: redis at %s does not answer: %w", Name, addr, err)
	}
	return rdb, nil
}

func newDeployment(cfg strategy.Config, opts Options, tb tables, rdb *redis.Client) *Deployment {
	d := &Deployment{db: cfg.DB, rdb: rdb, tb: tb, skus: cfg.SKUs(), owns: pgstrategy.NewSKUs(cfg),
		lockOnly: opts.LockOnly || opts.Mistake == ConditionInCheckOnly, unlockErrorIsBusy: opts.Mistake == UnlockErrorIsBusy,
		busyWhenLost: opts.Mistake == BusyWhenLost, waitIsSoldOut: opts.Mistake == WaitIsSoldOut, sessionRelocks: opts.Mistake == SessionRelocks,
		doubleCheckStockOnly: opts.Mistake == DoubleCheckStockOnly, preCheckStockOnly: opts.Mistake == PreCheckStockOnly, preCheckUser: opts.Mistake == PreCheckUser, lastUnitWaitSoldOut: opts.Mistake == LastUnitWaitSoldOut, goneIsBusy: opts.Mistake == GoneAfterCommitIsBusy, setFromCheck: opts.Mistake == SetFromCheck,
		locks: &locker{rdb: rdb, lib: redislock.New(rdb), prefix: "reservebench:" + tb.prefix + ":lock:",
			ttl: opts.leaseFor(cfg), wait: opts.wait(), poll: DefaultPoll, unlockByDelete: opts.Mistake == UnlockByDelete, abandonByDelete: opts.Mistake == AbandonByDelete, lockWaitSticky: opts.Mistake == LockWaitSticky}}
	d.Handles = pgstrategy.NewHandles(Name, cfg.NodeCount(), func(h *pgstrategy.Handle) strategy.Strategy {
		return &node{Handle: h, d: d}
	})
	return d
}

// Deployment keeps nothing in memory but its SKUs and its Redis client:
// every node is a handle on the pool and the client, and a restart loses
// nothing (the locks live in Redis, the stock in PostgreSQL).
type Deployment struct {
	*pgstrategy.Handles
	db       *pgxpool.Pool
	rdb      *redis.Client
	tb       tables
	skus     []string
	owns     pgstrategy.SKUs
	locks    *locker
	lockOnly bool

	unlockErrorIsBusy    bool // Options.Mistake UnlockErrorIsBusy
	busyWhenLost         bool // Options.Mistake BusyWhenLost
	waitIsSoldOut        bool // Options.Mistake WaitIsSoldOut
	doubleCheckStockOnly bool // Options.Mistake DoubleCheckStockOnly
	preCheckStockOnly    bool // Options.Mistake PreCheckStockOnly
	preCheckUser         bool // Options.Mistake PreCheckUser
	lastUnitWaitSoldOut  bool // Options.Mistake LastUnitWaitSoldOut
	sessionRelocks       bool // Options.Mistake SessionRelocks
	goneIsBusy           bool // Options.Mistake GoneAfterCommitIsBusy
	setFromCheck         bool // Options.Mistake SetFromCheck
}

var (
	_ strategy.Deployment          = (*Deployment)(nil)
	_ strategy.Restarter           = (*Deployment)(nil)
	_ strategy.Ager                = (*Deployment)(nil)
	_ strategy.Strategy            = (*node)(nil)
	_ strategy.Confirmer           = (*node)(nil)
	_ strategy.Releaser            = (*node)(nil)
	_ strategy.Expirer             = (*node)(nil)
	_ strategy.SessionOpener       = (*node)(nil)
	_ strategy.ExpirySessionOpener = (*node)(nil)
	_ strategy.LockTaker           = (*node)(nil)
	_ strategy.LockedSession       = (*session)(nil)
	_ strategy.ExpirySession       = (*session)(nil)
)

// Close closes every node and the Redis client; it drops no data and
// leaves the pool, which is the caller's, open.
func (d *Deployment) Close() error {
	err := d.Handles.Close()
	if cerr := d.rdb.Close(); err == nil && cerr != nil && cerr != redis.ErrClosed {
		err = cerr
	}
	return err
}

type node struct {
	*pgstrategy.Handle
	d *Deployment
}

// LockOf says where the lock of sku lives.
func (n *node) LockOf(sku string) strategy.LockInfo {
	return strategy.LockInfo{Resource: strategy.Redis, Key: n.d.locks.key(sku), TTL: n.d.locks.ttl, Wait: n.d.locks.wait}
}
