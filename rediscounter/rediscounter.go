package rediscounter

import (
	"context"
	_ "embed"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// Name is the name of the registered variant (Keep: KeepNothing); the
// others append their Keep, e.g. "rediscounter-aof-always".
const Name = "rediscounter"

// Keep says what survives a restart of Redis, and so where a missing stock
// counter comes back from.
type Keep string

// The variants.
const (
	// KeepNothing: Redis without persistence; a missing counter is
	// reloaded from the config (the total), as a deployment that
	// preloads stock at start does.
	KeepNothing Keep = "nothing"
	// KeepAOFEverysec: appendonly yes, appendfsync everysec. Every write
	// reaches the kernel before its reply; the fsync follows within a
	// second, so a SIGKILL loses nothing and a power cut up to a second.
	KeepAOFEverysec Keep = "aof-everysec"
	// KeepAOFAlways: appendonly yes, appendfsync always: fsynced before
	// the reply.
	KeepAOFAlways Keep = "aof-always"
	// KeepRecover: Redis without persistence; a missing counter, and every
	// restarted node, recomputes it from PostgreSQL (total minus active
	// reservations), markers too.
	KeepRecover Keep = "recover"
)

// Keeps lists the variants in a fixed order.
var Keeps = []Keep{KeepNothing, KeepAOFEverysec, KeepAOFAlways, KeepRecover}

func init() {
	for _, k := range Keeps {
		strategy.Register(New(Options{Keep: k}))
	}
}

// Options configure the strategy; the zero value is KeepNothing.
type Options struct {
	Keep Keep
	// Mistake is a deliberate mistake, for the negative controls of table
	// 28-1 only (package compare). NoMistake, the zero value, is the
	// strategy.
	Mistake Mistake
}

// Mistake names a deliberate mistake of Options.Mistake.
type Mistake int

const (
	NoMistake Mistake = iota
	// KeepUnitOnUserLimit: a request whose row the per-user index refuses
	// (the user holds one that Redis had forgotten) keeps the unit its
	// script took instead of giving it back.
	KeepUnitOnUserLimit
	// RecoverCountOnly: KeepRecover rebuilds the counter from PostgreSQL
	// but not the key and user markers, so a reservation sold before Redis
	// lost its data gives no unit back when it is released or expires.
	RecoverCountOnly
	// ErrorIsBusy: any error of the take script is answered BUSY (nothing
	// written), also a reply that timed out after Redis ran the script.
	ErrorIsBusy
	// RestartRecountsCommitted: KeepRecover's restart recounts from the
	// committed reservations alone, at once: a request in flight, on the
	// restarted node or another, that took its unit and commits after the
	// read has its unit sold again.
	RestartRecountsCommitted
	// RecountBounded: KeepRecover's recount keeps the script's arguments
	// below 1,000 active reservations and subtracts only those, so a SKU
	// with more sells the rest again after a restart.
	RecountBounded
	// GiveBackByUser: the give-back script is guarded by the user's marker
	// instead of the key's, so a release sent again after the same user
	// reserved the SKU anew gives the new reservation's unit back.
	GiveBackByUser
	// KeysExpire: every take sets a TTL of a week on the SKU's keys ("keys
	// of SKUs nobody sells any more fill Redis"): a SKU sold out and paid
	// for sits quiet, its counter expires, and it is loaded again whole.
	KeysExpire
	// OpenKeepsCounter: Open loads a SKU's counter only where Redis has
	// none ("a second app server must not reset the stock the first is
	// selling from"): a database made again meets its earlier life's count.
	OpenKeepsCounter
	// SKUNameCut: the SKU in the keys' names is cut to 40 bytes ("key
	// names are capped at 64 bytes"): two SKUs that share their first 40
	// bytes share one counter.
	SKUNameCut
	// SKUNameHashed: the SKU in the keys' names is its CRC-32 ("a SKU with
	// '}' breaks the hash tag; eight hex digits are safe"): two SKUs whose
	// CRC-32 is equal share one counter.
	SKUNameHashed
	// UndoReleaseOnError: a Release whose give-back to Redis fails sets
	// its row back to HELD ("the unit did not come back, so the release
	// did not happen"), although a give-back whose reply was lost may have
	// run: the unit is then free in Redis and held by the row, and sells
	// twice.
	UndoReleaseOnError
	// ReleaseNotOwed: a Release moves its row without marking its unit
	// owed ("the give-back right after it returns the unit"): when the
	// give-back does not reach Redis and the client does not send the
	// release again, the expiry job never gives the unit back (outsider
	// round 32's m12).
	ReleaseNotOwed
	// ExpireCountsOnly: the expiry job gives its units back with one
	// INCRBY per row moved ("the job moved the rows, so the units are
	// owed"), leaving the keys' markers in Redis: a release of an expired
	// hold then finds its marker and gives the unit back again.
	ExpireCountsOnly
	// OwedNeverSwept: the expiry job gives back the units of the rows it
	// moves and no others, so a unit whose give-back never happened (a
	// crash after the UPDATE, an UPDATE whose COMMIT outlived its caller's
	// deadline) stays out of the counter for good.
	OwedNeverSwept
	// BatchGiveBack: the expiry job gives back the units of the rows it
	// moved with one INCRBY per SKU, dropping the keys' markers but not
	// asking them: a release whose give-back came first (it found the row
	// moved and the unit owed) has its unit given back twice.
	BatchGiveBack
	// ResendKeepsNode: a resend leaves its key marked as the node that
	// first took its unit ("the marker is already there"): when that node
	// died mid-reserve and restarts while the resend's insert is on its
	// way, the recount finds a unit of its own with no row, gives it back,
	// and the resend's unit sells twice.
	ResendKeepsNode
	// ResendMovesNode: a resend marks its key as its own node's alone
	// (rediscounter until 2026-12-05): when the resend gives up and its
	// node restarts while the first attempt's insert, on another node, is
	// still on its way, the recount gives the unit back, and it sells twice.
	ResendMovesNode
	// RestartDrainBounded: a restart waits at most restartDrainBound for
	// the node's requests in flight, then recounts ("a deploy must not
	// hang on one stuck request"): a request whose insert waits longer
	// (on a lock, a slow disk) has its unit given back by the recount, and
	// when it commits the unit sells twice.
	RestartDrainBounded
	// OwedClearedTried: the expiry job clears the owed mark of every row
	// it tried to give back, not only of those whose give-back ran ("the
	// give-back is idempotent per key; a failed one keeps its marker in
	// Redis"): when a give-back times out, the loop stops, and the rows
	// after it lose their units for good, since nothing sweeps markers.
	OwedClearedTried
	// ExpiryRecounts: KeepRecover's expiry job, after its give-backs, also
	// recounts every SKU from the committed reservations, as a restart
	// after Redis lost its data does ("a lost unit is back within one
	// tick"): a request whose unit is taken and whose row is on its way
	// has its unit and marker dropped, and when its row commits the unit
	// sells twice.
	ExpiryRecounts
	// ReleaseRecounts: KeepRecover's Release, after its give-back, also
	// recounts the SKU from the committed reservations ("a release is a
	// quiet moment to settle the count"): a request whose unit is taken
	// and whose row is on its way has its unit and marker dropped, and
	// when its row commits the unit sells twice.
	ReleaseRecounts
	// KeyOtherFromMarker: a request whose key another user's request holds
	// a unit under in Redis, and which PostgreSQL does not have yet, is
	// answered KEY_REUSED at once with the owner the key's marker names
	// ("Redis knows who owns the key"), a reservation made up of what
	// Redis holds (HELD, no expires_at), instead of waiting for the row: the
	// owner's request may never commit, and the key is then refused for
	// good on the word of a reservation that does not exist.
	KeyOtherFromMarker
	// GiveBackOwnersMarks: a request whose key another SKU's row holds gives
	// its unit back under that row's key and user ("the row is the key's
	// truth"), not its own: when the row is another user's, the refused
	// user's mark on the SKU stays, and the user is answered USER_LIMIT for
	// a SKU it holds nothing of.
	GiveBackOwnersMarks
	// ReleaseCountsOwed: a Release that finds its row moved before and
	// gives back the unit still owed answers the units it gave back ("the
	// caller wants to know a unit came back"): a release whose give-back
	// failed moved the row, and the one sent again then says 1 although
	// it moved nothing.
	ReleaseCountsOwed
	// EndedRowKeepsUnit: a request whose insert meets its key's row of the
	// same SKU keeps the unit its script took, whatever the row's status
	// ("a resend: the row holds the unit my key's marker counts";
	// rediscounter until 2026-12-06). A copy that looked its key up before
	// another copy's reservation was made, and took its unit after that
	// reservation was released, took a fresh unit, not the row's: it stays
	// out of the counter, and the user marked as a holder, until the expiry
	// job sweeps the marker.
	EndedRowKeepsUnit
	// ReleaseAnswersGiveBacks: Release answers the units its give-back
	// returned to Redis, not the rows it moved ("the caller wants to know
	// the unit is back"): after Redis lost its data, a release of a HELD
	// reservation moves its row, finds no marker to give back under, and
	// says 0, so its caller thinks the hold had ended before.
	ReleaseAnswersGiveBacks
	// InsertLostIsBusy: an insert that fails without an answer from the
	// server (the connection broke) gives the unit back and answers BUSY
	// ("the row never got there"): an autocommit INSERT the server ran
	// before the connection broke has committed, and the user is told
	// nothing was reserved while a row holds the unit, its unit counted
	// free as well.
	InsertLostIsBusy
	// RestartSkipsOrphans: a KeepRecover restart recounts without waiting
	// for the backends of the node's inserts whose outcome is unknown
	// (rediscounter-recover until 2026-12-06): an insert whose client gave
	// up and whose COMMIT lands after the recount has its unit sold again.
	RestartSkipsOrphans
	// ReloadSkipsOrphans: a KeepRecover counter reloaded from PostgreSQL
	// after Redis restarted empty is recounted without waiting for the
	// backends of inserts whose outcome is unknown (rediscounter-recover
	// until 2026-12-06): such an insert's COMMIT lands after the recount
	// counted its unit free, and the unit sells twice.
	ReloadSkipsOrphans
	// ExpireGiveBackInTx: the expiry job moves the due rows, gives their
	// units back in Redis and clears unit_owed in one transaction ("a
	// give-back that fails rolls the expiry back, so nothing is ever
	// owed"): a transaction lost at its COMMIT, after the give-back, leaves
	// the row HELD and its unit in the counter as well.
	ExpireGiveBackInTx
	// EvictionUndeclared: the variant does not ask for maxmemory-policy
	// noeviction (rediscounter until 2026-12-07): under a maxmemory with an
	// allkeys policy Redis may evict the counter or a marker of a SKU with
	// units out, and a give-back then finds no marker (a unit lost) or
	// recounts nothing (a unit sold twice).
	EvictionUndeclared
	// OrphansOfNodeZero: a KeepRecover restart of node i, and a counter
	// reloaded after Redis restarted empty, wait for the backends of node
	// 0's inserts whose outcome is unknown, whichever node's they are
	// (outsider round 54's m32 and m18): node 1's insert whose COMMIT
	// lands after the recount has its unit sold again.
	OrphansOfNodeZero
	// SKUMarksRewritten: a SKU's Redis key names have its ':' made '_' and
	// its braces dropped ("a ':' breaks our key scheme, a '{' the hash
	// tag"), so SKUs that differ only there share one counter (outsider
	// round 54's m13 and m14).
	SKUMarksRewritten
	// DownIsSoldOut: a request that finds Redis down is answered SOLD_OUT
	// ("nothing can be sold now") instead of BUSY (outsider round 54's
	// m11): a client stops asking while units are free.
	DownIsSoldOut
	// EndedIsReleasedOnly: EndedRowKeepsUnit for an EXPIRED row alone: a
	// late copy whose insert meets its key's row counts only a RELEASED
	// row as ended, and keeps the unit it took beside an EXPIRED one
	// (outsider round 54's m20).
	EndedIsReleasedOnly
)

// restartDrainBound is how long a restart with Mistake RestartDrainBounded
// waits for the node's requests in flight.
const restartDrainBound = 5 * time.Second

func (o Options) keep() Keep {
	if o.Keep == "" {
		return KeepNothing
	}
	return o.Keep
}

// settings are the redis.conf lines a variant relies on. Every variant
// needs Redis to keep each key until the script deletes it: with a
// maxmemory and an allkeys policy, Redis may evict the counter of a SKU
// whose units are out, or a marker of a held unit, while it runs. The
// variants that keep nothing across a restart also refuse snapshots
// (save ""): a restart from an RDB file would bring back a stale counter
// with the units sold since the snapshot counted free, which the recount
// never sees, because the counter is not missing.
func (o Options) settings() []string {
	var out []string
	switch o.keep() {
	case KeepAOFEverysec:
		out = []string{"appendonly yes", "appendfsync everysec"}
	case KeepAOFAlways:
		out = []string{"appendonly yes", "appendfsync always"}
	default:
		out = []string{"appendonly no", `save ""`}
	}
	if o.Mistake != EvictionUndeclared {
		out = append(out, "maxmemory-policy noeviction")
	}
	return out
}

// Claims are what every variant keeps while Redis runs. Only KeepRecover
// adds strategy.SurvivesRestart: the others lose or double units when
// Redis comes back without them (observed in the redis-restart and
// node-death scenarios). No variant offers sessions, so the waiting and
// phantom claims are not made.
const Claims = strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser | strategy.ReturnOnce | strategy.Conserves

// Meta is the registered variant KeepNothing.
func Meta() strategy.Meta { return New(Options{}) }

// New describes the variant of opts.
func New(opts Options) strategy.Meta {
	name, claims := Name, Claims
	if k := opts.keep(); k != KeepNothing {
		name += "-" + string(k)
	}
	keeps := map[Keep]string{
		KeepNothing:     "a missing counter is reloaded from the config",
		KeepAOFEverysec: "Redis AOF, appendfsync everysec",
		KeepAOFAlways:   "Redis AOF, appendfsync always",
		KeepRecover:     "a missing counter, and a restarted node, recount from the PostgreSQL log",
	}
	if opts.keep() == KeepRecover {
		claims |= strategy.SurvivesRestart
	}
	return strategy.Meta{
		Name:        name,
		Description: "stock counted in Redis, taken by one Lua script (check and decrement), then the reservation row in PostgreSQL; " + keeps[opts.keep()],
		Correctness: "the Lua script's check and decrement are atomic in Redis; only as long as Redis keeps the counter",
		Claims:      claims,
		Isolation:   "read committed",
		Retry:       "none: a command retried after its connection broke may have run the first time, so a request cut after the decrement is unknown until resent with its key",
		Needs:       []strategy.Need{{Resource: strategy.Redis, Settings: opts.settings()}},
		Open:        pgstrategy.Bind(Open, opts),
	}
}

//go:embed schema.sql
var schemaSQL string

var schema = pgstrategy.Schema{
	DDL:     schemaSQL,
	Last:    "rediscounter_unit_owed",
	LockKey: 0x7263746572, // "rcter"
	Totals:  `SELECT sku, total FROM rediscounter_stock WHERE sku = ANY($1)`,
}

const sqlInsertStock = `
INSERT INTO rediscounter_stock (sku, total)
SELECT sku, total FROM unnest($1::text[], $2::int[]) AS s (sku, total)
ON CONFLICT (sku) DO NOTHING
RETURNING sku`

// Open checks that the Redis of cfg runs with the variant's settings,
// loads the stock into PostgreSQL (strategy.ErrStockExists for a SKU that
// has stock) and then each counter into Redis.
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rdb, err := connect(ctx, cfg, opts)
	if err != nil {
		return nil, err
	}
	err = schema.Load(ctx, cfg, func(tx pgx.Tx) error {
		skus, totals := make([]string, len(cfg.Stock)), make([]int32, len(cfg.Stock))
		for i, s := range cfg.Stock {
			skus[i], totals[i] = s.SKU, int32(s.Total)
		}
		rows, err := tx.Query(ctx, sqlInsertStock, skus, totals)
		if err != nil {
			return fmt.Errorf("insert stock: %w", err)
		}
		return pgstrategy.AllInserted(rows, skus)
	})
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("%s: open: %w", Name, err)
	}
	d := newDeployment(cfg, opts, rdb)
	for _, s := range cfg.Stock {
		if err := d.load(ctx, s.SKU, d.mistake != OpenKeepsCounter, ""); err != nil {
			_ = rdb.Close()
			return nil, fmt.Errorf("%s: open: %w", Name, err)
		}
	}
	return d, nil
}

// connect opens a client on the Redis of cfg and checks its settings.
func connect(ctx context.Context, cfg strategy.Config, opts Options) (*redis.Client, error) {
	addr, err := cfg.Resource(strategy.Redis)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	opt, err := redis.ParseURL(addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: redis address %q: %v", Name, strategy.ErrConfig, addr, err)
	}
	// No automatic retry: a command retried after its connection broke may
	// have run the first time, and a dial error on the retry would then be
	// taken for "never reached Redis" (BUSY) while the unit was taken.
	// Without retries a dial error proves the script never ran; anything
	// else is an unknown outcome, which a resend of the request settles.
	opt.MaxRetries = -1
	opt.DialerRetries = 1 // go-redis's default, 5 dials 100 ms apart, makes a down Redis cost 0.5 s a call
	opt.DialTimeout = time.Second
	opt.ReadTimeout = 2 * time.Second
	opt.WriteTimeout = 2 * time.Second
	opt.PoolSize = 64
	rdb := redis.NewClient(opt)
	for _, line := range opts.settings() {
		name, want, _ := strings.Cut(line, " ")
		if unquoted, err := strconv.Unquote(want); err == nil {
			want = unquoted // save "" is the empty value
		}
		got, err := rdb.ConfigGet(ctx, name).Result()
		if err != nil {
			_ = rdb.Close()
			return nil, fmt.Errorf("%s: redis at %s: CONFIG GET %s: %w", Name, addr, name, err)
		}
		if got[name] != want {
			_ = rdb.Close()
			return nil, fmt.Errorf("%s: %w: redis at %s has %s %q; this variant keeps what it claims only with %q", Name, strategy.ErrConfig, addr, name, got[name], want)
		}
	}
	return rdb, nil
}

func newDeployment(cfg strategy.Config, opts Options, rdb *redis.Client) *Deployment {
	d := &Deployment{db: cfg.DB, rdb: rdb, keep: opts.keep(), mistake: opts.Mistake, skus: cfg.SKUs(), owns: pgstrategy.NewSKUs(cfg), nodes: cfg.NodeCount(),
		inFlight: make([]sync.RWMutex, cfg.NodeCount()), orphans: make([]orphans, cfg.NodeCount())}
	d.Handles = pgstrategy.NewHandles(Name, cfg.NodeCount(), func(h *pgstrategy.Handle) strategy.Strategy {
		return &node{Handle: h, d: d}
	})
	return d
}

// Deployment is the strategy over one database and one Redis. Nodes keep
// nothing in memory: the counters are Redis's.
type Deployment struct {
	*pgstrategy.Handles
	db      *pgxpool.Pool
	rdb     *redis.Client
	keep    Keep
	mistake Mistake
	skus    []string
	owns    pgstrategy.SKUs
	nodes   int
	// inFlight[i] is held shared by node i's reservations and exclusively
	// by its restart, which recounts only once they have ended.
	inFlight []sync.RWMutex
	// orphans[i] are the backends of node i's inserts whose outcome is
	// unknown (the client gave up, the connection broke): a KeepRecover
	// restart waits for them before it recounts, since each may still
	// commit its row.
	orphans []orphans
}

// orphans is a set of backend pids, safe for concurrent use.
type orphans struct {
	mu   sync.Mutex
	pids map[int32]struct{}
}

func (o *orphans) add(pid int32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pids == nil {
		o.pids = map[int32]struct{}{}
	}
	o.pids[pid] = struct{}{}
}

// peek returns what the set holds. A pid stays until a restart of its
// node takes it: a backend done is passed at once by AwaitBackendsDone.
func (o *orphans) peek() []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]int32, 0, len(o.pids))
	for pid := range o.pids {
		out = append(out, pid)
	}
	return out
}

// take empties the set and returns what it held.
func (o *orphans) take() []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]int32, 0, len(o.pids))
	for pid := range o.pids {
		out = append(out, pid)
	}
	o.pids = nil
	return out
}

var (
	_ strategy.Deployment     = (*Deployment)(nil)
	_ strategy.Restarter      = (*Deployment)(nil)
	_ strategy.Ager           = (*Deployment)(nil)
	_ strategy.ReserveCrasher = (*Deployment)(nil)
	_ strategy.Strategy       = (*node)(nil)
	_ strategy.Confirmer      = (*node)(nil)
	_ strategy.Releaser       = (*node)(nil)
	_ strategy.Expirer        = (*node)(nil)
)

// keys are the deployment's names of sku's keys: keys(sku), but for the
// Mistakes SKUNameCut, SKUNameHashed and SKUMarksRewritten.
func (d *Deployment) keys(sku string) []string {
	switch {
	case d.mistake == SKUMarksRewritten:
		sku = strings.NewReplacer(":", "_", "{", "", "}", "").Replace(sku)
	case d.mistake == SKUNameCut && len(sku) > 40:
		sku = sku[:40]
	case d.mistake == SKUNameHashed:
		sku = fmt.Sprintf("%08x", crc32.ChecksumIEEE([]byte(sku)))
	}
	return keys(sku)
}

// keys are the Redis keys of a SKU: stock, key markers, user markers, the
// node of each key marker.
func keys(sku string) []string {
	p := "reservebench:rediscounter:{" + sku + "}:"
	return []string{p + "stock", p + "keys", p + "users", p + "nodes"}
}

// Restart closes node i and opens it again. KeepRecover recounts every
// SKU from PostgreSQL as it starts: it first waits for node i's requests
// in flight, then replaces the counter and the markers by what the log
// says, keeping the units of other nodes' requests that took theirs and
// have not committed (loadScript). The other variants find the counter as
// Redis kept it.
func (d *Deployment) Restart(ctx context.Context, i int) error {
	if d.keep != KeepRecover || i < 0 || i >= d.nodes {
		return d.Handles.Restart(ctx, i)
	}
	node := strconv.Itoa(i)
	if d.mistake == RestartRecountsCommitted {
		node = ""
	} else if d.mistake != RestartDrainBounded {
		d.inFlight[i].Lock()
		defer d.inFlight[i].Unlock()
	} else if drained := lockWithin(ctx, &d.inFlight[i], restartDrainBound); drained {
		defer d.inFlight[i].Unlock()
	}
	if err := d.Handles.Restart(ctx, i); err != nil {
		return err
	}
	of := i
	if d.mistake == OrphansOfNodeZero {
		of = 0
	}
	if pids := d.orphans[of].take(); d.mistake != RestartSkipsOrphans {
		// The kit's checkRestartBesideOrphan: an insert whose client gave
		// up may commit after a recount that counted its unit free.
		if err := pgstrategy.AwaitBackendsDone(ctx, d.db, pids); err != nil {
			return fmt.Errorf("%s: restart node %d: %w", Name, i, err)
		}
	}
	for _, sku := range d.skus {
		if err := d.load(ctx, sku, true, node); err != nil {
			return fmt.Errorf("%s: restart node %d: %w", Name, i, err)
		}
	}
	return nil
}

// lockWithin takes m for writing, giving up after bound (Mistake
// RestartDrainBounded).
func lockWithin(ctx context.Context, m *sync.RWMutex, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !m.TryLock() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}

// Close closes every node and the Redis client.
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
