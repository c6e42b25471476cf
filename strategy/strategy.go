package strategy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Strategy is one node of a deployed strategy: the part that answers requests.
//
// Every method is safe for concurrent use by many goroutines.
//
// Errors: Reserve returns (Result, nil) whenever the outcome is known, including
// SOLD_OUT, USER_LIMIT, KEY_REUSED and BUSY (nothing written, try again). An invalid request returns a Result with
// OutcomeBadRequest and an error matching ErrBadRequest; nothing was written.
// Any other error means the outcome is unknown to the caller: the reservation
// may or may not have been committed (a timeout or a broken connection at
// commit). The caller resolves it with Lookup on the same key, or by sending the
// same request again, which the contract makes safe.
type Strategy interface {
	// Reserve asks for one unit. It must never let active reservations exceed
	// the stock, never create two reservations for one key, and never give one
	// user two active reservations for one SKU, unless the strategy's Claims say
	// otherwise.
	Reserve(ctx context.Context, req Request) (Result, error)

	// Lookup returns the committed reservation with this key, or one with
	// Status StatusNotFound. NOT_FOUND means "nothing committed now", not "the
	// request failed": a Reserve still in flight may commit later. Keys are
	// unique across every deployment of the strategy in the database, so
	// Lookup finds a key whatever SKU it is for; the transitions (Confirm,
	// Release, ExpireDue) touch only the deployment's own SKUs.
	Lookup(ctx context.Context, key string) (Reservation, error)
}

// Confirmer is implemented by strategies that can confirm a HELD reservation
// (a payment arrived). Without it the harness skips confirm scenarios and
// reports them as not supported.
type Confirmer interface {
	// Confirm moves the reservation with this key from HELD to CONFIRMED and
	// reports whether this call moved it. The WHERE clause of the transition
	// carries status = 'HELD', so of several racing transitions exactly one
	// moves the row. See ConfirmMode for how expires_at is treated.
	Confirm(ctx context.Context, key string, mode ConfirmMode) (bool, error)
}

// ConfirmMode says how Confirm treats a HELD reservation whose expires_at has
// passed.
type ConfirmMode int

const (
	// ConfirmBeforeExpiry confirms only while expires_at has not passed.
	ConfirmBeforeExpiry ConfirmMode = iota
	// ConfirmUntilExpired also confirms a reservation past expires_at as long as
	// no expiry has moved it yet: the late payment callback of seed C28-08,
	// which races the expiry job for the row.
	ConfirmUntilExpired
)

// Releaser is implemented by strategies whose clients can give a held unit
// back before it expires. Without it the harness skips release scenarios.
type Releaser interface {
	// Release moves the reservation from HELD to RELEASED and returns the
	// number of units this call gave back: 1 if it moved the row, 0 otherwise
	// (already released, expired, confirmed or unknown). Replaying it, also
	// concurrently, returns 0. A HELD row whose expires_at has passed is not
	// yet expired: until a transition moves it, Release moves it too (a
	// ConfirmUntilExpired would still confirm it).
	Release(ctx context.Context, key string) (units int, err error)
}

// Expirer is implemented by strategies that run an expiry job. Without it the
// harness skips expiry scenarios.
type Expirer interface {
	// ExpireDue moves every HELD reservation of the deployment whose expires_at
	// has passed to EXPIRED and returns the units given back. The count comes
	// only from rows this call moved (RETURNING), never from ids read earlier,
	// so a replay, a concurrent run or a rerun after a crash returns each unit
	// exactly once.
	ExpireDue(ctx context.Context) (units int, err error)
}

// SessionOpener is implemented by strategies that can hold an attempt open:
// run a reservation inside a transaction and let the caller decide later
// whether to commit it. The harness builds interleavings (t1 holds an
// uncommitted reservation while t2 and t3 arrive) from sessions, and kills a
// helper process that holds one (kill-reserve). Without it, those scenarios
// are not applicable.
type SessionOpener interface {
	OpenSession(ctx context.Context) (Session, error)
}

// Transaction is work held open in one database transaction: the part a
// Session and an ExpirySession share. Exactly one of Commit or Rollback must
// be called; Rollback after Commit is a no-op, so `defer s.Rollback(ctx)` is
// always safe. When the connection is already gone, Rollback may report why;
// the work is undone either way (PostgreSQL rolls back the transaction of a
// dead session). Other calls after either fail with ErrSessionEnded.
type Transaction interface {
	// Backends returns the PostgreSQL backend PIDs the work runs on, so the
	// harness can tell that a step is blocked from pg_locks or
	// pg_blocking_pids, the way PostgreSQL's isolation tester does. It is
	// valid from the open on, before any statement that could block.
	Backends() []uint32
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Session is one reservation attempt held open. Reserve runs inside the
// session's transaction; its effects become visible to others only after
// Commit, and Rollback undoes them (for in-memory strategies too: the unit
// goes back).
type Session interface {
	Transaction
	Reserve(ctx context.Context, req Request) (Result, error)
}

// ExpirySessionOpener is implemented by strategies that can run the expiry
// job inside a transaction held open: the harness runs it in a helper
// process and kills that process between the job's work and its commit
// (seed C28-09). Without it, the kill-release scenario is not applicable.
type ExpirySessionOpener interface {
	OpenExpirySession(ctx context.Context) (ExpirySession, error)
}

// ExpirySession is the expiry job held open.
type ExpirySession interface {
	Transaction
	// ExpireDue is Expirer.ExpireDue inside the session's transaction: the
	// units it reports come back only if the session commits.
	ExpireDue(ctx context.Context) (units int, err error)
}

// ErrSessionEnded is matched (errors.Is) by the error of a Session or
// ExpirySession used after Commit or Rollback.
var ErrSessionEnded = errors.New("session already ended")

// ErrNodeClosed is matched by the error of a node that was restarted or
// whose deployment was closed: the caller must ask the Deployment for the
// current node.
var ErrNodeClosed = errors.New("node closed (restarted, or its deployment closed)")

// Deployment is a strategy deployed over one database: its nodes, its stock
// and the audit of its durable state. A Deployment covers exactly the SKUs of
// its Config; several Deployments with disjoint SKUs may share a database.
type Deployment interface {
	// Node returns node i, 0 <= i < Config.NodeCount(). Any other i panics
	// with an error matching ErrNodeRange (call CheckNode first), as an
	// index out of range does. The value changes when the node is
	// restarted. Every node of a deployment has the same capabilities.
	Node(i int) Strategy

	// Audit reports, per SKU, the stock against the reservations, read from
	// the durable state (plus, for strategies that count in memory, the live
	// nodes' counters). It is the conservation check run after every case.
	Audit(ctx context.Context) ([]StockAudit, error)

	// Close closes every node. It does not drop any data.
	Close() error
}

// ErrNodeRange is matched by the value Deployment.Node panics with for an
// index out of range.
var ErrNodeRange = errors.New("node index out of range")

// CheckNode panics with an error matching ErrNodeRange unless 0 <= i < n:
// the one behaviour of Deployment.Node for a bad index.
func CheckNode(i, n int) {
	if i < 0 || i >= n {
		panic(fmt.Errorf("%w: node %d of a deployment with %d nodes", ErrNodeRange, i, n))
	}
}

// Restarter is implemented by deployments whose nodes can be restarted in
// place. Without it the restart and node-death scenarios are not
// applicable.
type Restarter interface {
	// Restart closes node i and opens it again over the same database, as a
	// process restart would: whatever the node kept only in memory is lost,
	// and the node starts from what the strategy recovers on start. The old
	// node answers ErrNodeClosed from then on. An i out of range is an error
	// matching ErrNodeRange, not a panic, and restarts nothing.
	Restart(ctx context.Context, i int) error
}

// Ager is implemented by deployments that let a test make reservations due
// without waiting for their TTL, by moving expires_at into the past (seed 000
// does the same). Without it, expiry scenarios are skipped; a deployment
// whose nodes implement Expirer must implement it, or the kit's deployment
// contract fails (checkExpirerAges): its expiry job would go unchecked.
type Ager interface {
	// MakeDue moves expires_at of the HELD reservations with these keys
	// 400 days into the past and returns how many it moved. So far back on
	// purpose: a job or a late payment that looks back only over a bounded
	// window (the last hours, days or months) misses such a row; a row
	// just past its expires_at is made with a short TTL instead.
	MakeDue(ctx context.Context, keys []string) (int, error)
}

// ReserveCrasher is implemented by deployments whose nodes change state in
// memory before a reservation reaches the database (memquota's counters).
// Without it the node-death scenario is not applicable: a strategy whose
// state is all in PostgreSQL loses nothing when a client dies mid-reserve
// (the kill-reserve scenario shows that).
type ReserveCrasher interface {
	// CrashMidReserve runs a reservation on node i that dies between its
	// in-memory effect and its durable write, as a request killed at that
	// point would, and returns the error its client saw. The node itself
	// keeps running; whatever the dead request changed in memory stays
	// changed until the node restarts.
	CrashMidReserve(ctx context.Context, node int, req Request) error
}

// Stock is the number of units of one SKU.
type Stock struct {
	SKU   string
	Total int
	// Shares splits Total over the nodes, for strategies that give each
	// node a share: one entry per node, summing to Total. Nil means the
	// even split of ShareOf.
	Shares []int
}

// Share is node i's share of the stock when the deployment has n nodes:
// Shares[i] when Shares is set, else ShareOf(Total, n, i).
func (s Stock) Share(n, i int) int {
	if s.Shares != nil {
		return s.Shares[i]
	}
	return ShareOf(s.Total, n, i)
}

// Config is what Meta.Open needs to deploy a strategy.
type Config struct {
	// DB is the database the deployment lives in. The strategy creates its own
	// tables there (idempotently, so deployments can share a database) and
	// never drops anything. The pool's size bounds the connections in use.
	DB *pgxpool.Pool

	// Stock is loaded at Open. Every SKU must be new to the database: opening a
	// SKU that already has stock fails with ErrStockExists, so a restart goes
	// through Deployment.Restart, never through a second Open.
	Stock []Stock

	// Nodes is the number of nodes serving the stock; 0 means 1. Strategies
	// that split stock across nodes give node i the share Stock.Share(Nodes, i).
	Nodes int

	// Resources gives the address of each resource the strategy needs
	// besides PostgreSQL (Meta.Needs), e.g. {Redis: "unix:///tmp/r/redis.sock"}.
	// A strategy that needs none ignores it. Open fails with an error
	// matching ErrMissingResource when one it needs is missing.
	Resources map[Resource]string

	// InternalDeadline, when positive, bounds every deadline the strategy
	// sets on work of its own that no caller's context bounds (combine's
	// batch, which serves requests whose callers may give up); 0 keeps the
	// strategy's defaults. A strategy with such deadlines honours it, on a
	// deployment made by Open or by Attach (the kit's
	// checkInternalDeadlineKept: once a request's caller gave up, nothing
	// of it still waits in PostgreSQL 5 s later with 300 ms here). The
	// conformance kit sets it shorter than the stalls it makes, so that
	// the answer a strategy gives when its own deadline fires is checked:
	// with a default of 30 seconds no scenario would ever reach that code.
	InternalDeadline time.Duration

	// LockLease, when positive, is the lease of a lock the strategy takes
	// outside PostgreSQL and renews while its work runs (a watchdog, see
	// LockTaker); 0 keeps the strategy's default. The conformance kit sets
	// it short in the one check that takes a lock away from a holder that
	// is working (checkLockLostWhileWorking), so that a renewal meets the
	// loss within the check: with a lease of 30 s, renewed every 10 s, no
	// scenario would ever reach the code that handles it.
	LockLease time.Duration
}

// MaxTotal bounds the stock of one SKU: it must fit PostgreSQL's int4,
// which the strategies' counters use.
const MaxTotal = 1<<31 - 1

// ErrStockExists is returned by Meta.Open when a SKU of the Config already
// has stock in the database.
var ErrStockExists = errors.New("stock already exists for sku")

// ErrConfig is matched by errors that reject a Config before anything is written.
var ErrConfig = errors.New("invalid deployment config")

// NodeCount returns the number of nodes, treating 0 as 1.
func (c Config) NodeCount() int {
	if c.Nodes <= 0 {
		return 1
	}
	return c.Nodes
}

// SKUs returns the SKU names of the config, in order.
func (c Config) SKUs() []string {
	out := make([]string, len(c.Stock))
	for i, s := range c.Stock {
		out[i] = s.SKU
	}
	return out
}

// Validate checks the config; every Meta.Open calls it before writing.
func (c Config) Validate() error {
	if c.DB == nil {
		return fmt.Errorf("%w: no database", ErrConfig)
	}
	if c.Nodes < 0 {
		return fmt.Errorf("%w: negative node count %d", ErrConfig, c.Nodes)
	}
	if c.InternalDeadline < 0 {
		return fmt.Errorf("%w: negative internal deadline %v", ErrConfig, c.InternalDeadline)
	}
	if len(c.Stock) == 0 {
		return fmt.Errorf("%w: no stock", ErrConfig)
	}
	seen := make(map[string]bool, len(c.Stock))
	for _, s := range c.Stock {
		if err := checkText("sku", s.SKU, MaxSKULen); err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		if seen[s.SKU] {
			return fmt.Errorf("%w: sku %q listed twice", ErrConfig, s.SKU)
		}
		seen[s.SKU] = true
		if s.Total < 0 || s.Total > MaxTotal {
			return fmt.Errorf("%w: sku %q has total %d, want 0..%d", ErrConfig, s.SKU, s.Total, MaxTotal)
		}
		if s.Shares != nil {
			if len(s.Shares) != c.NodeCount() {
				return fmt.Errorf("%w: sku %q has %d shares for %d nodes", ErrConfig, s.SKU, len(s.Shares), c.NodeCount())
			}
			sum := 0
			for i, n := range s.Shares {
				if n < 0 {
					return fmt.Errorf("%w: sku %q: share of node %d is negative (%d)", ErrConfig, s.SKU, i, n)
				}
				sum += n
			}
			if sum != s.Total {
				return fmt.Errorf("%w: sku %q: shares %v sum to %d, not the total %d", ErrConfig, s.SKU, s.Shares, sum, s.Total)
			}
		}
	}
	return nil
}

// ShareOf splits total units over n nodes: every node gets total/n and the
// first total%n nodes one more, so the shares always sum to total.
func ShareOf(total, n, i int) int {
	share := total / n
	if i < total%n {
		share++
	}
	return share
}

// StockAudit is the conservation audit of one SKU.
type StockAudit struct {
	SKU string
	// Total is the stock the SKU was opened with.
	Total int
	// Available is what the strategy still counts as free: the available
	// column, the free slots, or the sum of the nodes' counters.
	Available int
	// Active is the number of HELD and CONFIRMED reservations in the durable
	// state: the truth the other two are checked against.
	Active int
	// Nodes breaks the audit down per node, for strategies that split stock.
	Nodes []NodeAudit
}

// NodeAudit is one node's part of a StockAudit.
type NodeAudit struct {
	Node      int
	Share     int // units configured for the node
	Available int // the node's live counter
	Active    int // active reservations the node handed out (durable)
	Sold      int // reservations the node ever handed out (durable), active or not
}

// Drift is total - available - active. It is 0 when every unit is either free
// or held by exactly one active reservation. Negative: units counted twice
// (oversell risk); positive: units lost (undersell).
func (a StockAudit) Drift() int { return a.Total - a.Available - a.Active }

// Oversold is how many active reservations exceed the stock, or 0.
func (a StockAudit) Oversold() int {
	if a.Active > a.Total {
		return a.Active - a.Total
	}
	return 0
}

// Meta describes a registered strategy. Register it from the package's init.
type Meta struct {
	// Name is short, unique and lower-case, e.g. "hotrow". It names the row in
	// table 28-1.
	Name string
	// Description is one line: the mechanism, e.g. "one stock row, conditional UPDATE".
	Description string
	// Correctness is one line: where the guarantee comes from, for table 28-1.
	Correctness string
	// Claims are the guarantees the harness holds the strategy to.
	Claims Claims
	// Needs lists what the strategy needs besides PostgreSQL (a Redis
	// server, and the settings it must run with). Whoever deploys the
	// strategy provides each in Config.Resources. Nil: PostgreSQL alone.
	Needs []Need
	// Isolation is the isolation level the strategy's transactions run at,
	// as PostgreSQL names it ("read committed", "repeatable read",
	// "serializable"): table 28-1's isolation matrix shows it, since the
	// same design can hold its claims at one level and not at another.
	// Empty: the strategy does not say (the table shows "–").
	Isolation string
	// Retry is the strategy's retry policy in one line: what it runs again
	// when PostgreSQL refuses a transaction (40001, 40P01) or a conflict it
	// met is gone, and how often; for the same matrix.
	Retry string
	// Open deploys the strategy over cfg.DB with cfg.Stock. It validates cfg
	// first and writes nothing when it is invalid.
	Open func(ctx context.Context, cfg Config) (Deployment, error)

	// Attach, when set, opens a deployment over stock that another process
	// already loaded with the same Stock (in any order) and Nodes: a second
	// process of the same service, as the fault scenarios run one in a
	// helper process to kill it. It validates cfg and writes nothing; a SKU
	// without stock, or with another total, is an ErrConfig error. Whatever
	// the strategy keeps in memory starts the way a restart would start it.
	// Nil: the scenarios that need a second process (kill-release,
	// kill-reserve) are not applicable.
	Attach func(ctx context.Context, cfg Config) (Deployment, error)

	// Setup, when set, creates the strategy's schema as an owner role and
	// grants a runtime role only what serving needs (see SetupConfig):
	// Open and Attach then run as the runtime role, which owns nothing. Nil:
	// Open creates its tables as the role it serves as, which owns them
	// (not least-privilege; the least-privilege scenario is n/a).
	Setup func(ctx context.Context, cfg SetupConfig) error
}

// TTLForever is a TTL for cases that never expire anything.
const TTLForever = time.Hour

// LockTaker is implemented by nodes whose reservations take a lock outside
// PostgreSQL (a Redis lock per SKU) before they write. The harness uses it
// to run the lock-fault scenarios against any such strategy: the lock
// released before the commit, the lock expiring while its holder is
// stalled, the lock service restarted empty. Without it those scenarios
// are not applicable. The sessions of such a node implement LockedSession.
// Its Reserve should also report a wait for the lock through the LockWait
// its context may carry: the harness then sees the wait at once, as it
// sees a backend in pg_blocking_pids, where it would otherwise wait out a
// bound of seconds per check (redislock's deployment contract took 88 s
// without, 21 s with).
type LockTaker interface {
	// LockOf describes the lock a reservation of sku takes.
	LockOf(sku string) LockInfo
}

// Queuer is implemented by nodes that hold requests in memory before any
// of them reaches the database: a node that gathers a SKU's requests into
// one batch (combine). Queued reports how many Reserve calls for sku wait
// in the node right now, not yet sent. The harness waits for it before a
// step that needs requests to go together, or in a known order, as it
// waits for a backend in pg_blocking_pids: without it, whether two calls
// begun one after the other are both queued when a batch starts is the
// scheduler's doing, and a check that needs them together misses a bug in
// some of its runs.
type Queuer interface {
	Queued(sku string) int
}

// LockInfo says where a lock lives, so the harness can watch it (for
// Redis: PTTL of Key on the server of the Resource).
type LockInfo struct {
	Resource Resource
	Key      string
	// TTL is the lease a holder's renewal (watchdog) keeps extending; Wait
	// bounds how long a reservation waits for the lock before BUSY.
	TTL, Wait time.Duration
}

// LockedSession is a Session of a LockTaker: its Reserve takes the SKU's
// lock and holds it until Commit or Rollback (released after the commit).
// The other methods let the harness reproduce what goes wrong with locks.
type LockedSession interface {
	Session
	// LockWaiting reports whether a Reserve of this session is waiting for
	// the lock right now: the harness counts it as blocked, as it counts a
	// backend in pg_blocking_pids.
	LockWaiting() bool
	// DropLock releases the lock now, before the transaction ends: an
	// unlock in a finally block that runs before the commit (seed 002's
	// timeline).
	DropLock(ctx context.Context) error
	// StallLock stops renewing the lock and shortens its remaining lease to
	// ttl, as a holder stalled past its lease (a GC pause, a lost watchdog)
	// would leave it: the lock expires while the work is still open.
	StallLock(ctx context.Context, ttl time.Duration) error
}
