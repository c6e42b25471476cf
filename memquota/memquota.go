// Package memquota is strategy C of table 28-1: every node holds a share of
// the stock in memory, takes a unit from its own counter first and only then
// writes one row to a sales log in PostgreSQL. It is registered twice, with
// the two ways a node can start again:
//
//	memquota          restart from config: the node's counter is its configured share again
//	memquota-recover  restart from the log: the configured share minus the node's active sales
//
// The constructors are those of every strategy package: Meta is the
// registered "memquota", New(Options{Restart: FromLog}) the recover variant,
// and Open returns the concrete *Deployment (strategy.Deployment, Restarter,
// Ager and ReserveCrasher, with Settle and the pgbench script of package
// bench). Meta.Attach opens a second process over stock already loaded and
// starts its counters as a restart would. A node that was restarted or
// closed answers strategy.ErrNodeClosed; a session used after its end,
// strategy.ErrSessionEnded.
//
// # Where the guarantee comes from
//
// The shares of a SKU sum to its stock (strategy.ShareOf, written once to
// memquota_share), and a node never hands out more than its counter holds:
// the counter is decremented with a lock-free compare-and-swap that never
// goes below zero, before anything is written. So no more units are sold
// than the stock, as long as no counter is ever lost or counted twice. The
// database does not check the stock at all; it only keeps the log, whose
// unique indexes give request-key idempotency (REPLAY, KEY_REUSED) and one
// active reservation per user and SKU (USER_LIMIT). A refused insert gives
// its unit back to the counter; a transition out of HELD (release, expiry)
// gives the unit back to the counter of the node that sold it, once per row
// the statement moved (RETURNING), under READ COMMITTED, whose re-check of
// status = 'HELD' on the newest row version lets exactly one of racing
// transitions move a row.
//
// A repeated key is answered REPLAY, never SOLD_OUT or USER_LIMIT: before
// either answer the node looks the key up in the log. Identical requests
// arriving on one node at once are coalesced in the node: one runs, the
// others get its answer as a REPLAY (TestDuplicateKeyStorm); without that
// they would drain the node's counter before the log could tell them they
// are one request, and the lookup would not find the row yet either.
//
// Nothing waits for stock (NoWait): the counter answers at once. A request
// waits only for an attempt in flight with the same key, or the same user and
// SKU, whose commit decides its answer: its insert waits on the unique
// index; on a node with no unit left, the lookup sees from an advisory lock
// that an insert of the key may be in flight and then waits for that
// insert's transaction, which may itself still wait on its user before it
// has a row (the kit's deployment contract sends such a resend through
// another node, and a second process), and then for any row of the key
// (TestRepeatedKeyWaitsForOpenAttempt). An attempt held open that finds no
// unit waits for the key's row alone: a resend inside a session, while its
// first attempt waits on its user, may still be answered SOLD_OUT.
//
// # How it fails
//
// Restart oversell (seed C28-15, TestRestartOversell). A node restarted from
// its configured share sells it again: 40 units over 2 nodes, node 0 sells
// its 20, node 1 its 20, node 0 restarts and sells 20 more; the log has 60
// active sales for 40 units, and only the audit notices, after the fact
// (Deployment.Audit: Active 60 > Total 40, Oversold 20, drift -20): no
// constraint refuses the 41st row. Restarting from the log (memquota-recover)
// sells none of the 20. A restart also kills the node's attempts held open,
// so none commits after the log was counted (TestRestartAbandonsHeldOpenAttempt).
//
// Lost units (the crash the seed did not test,
// TestCrashBetweenDecrementAndLog). A request that dies after the decrement
// and before its log row takes the unit with it: the counter is down, no row
// holds it, the audit shows a positive drift, and the node says SOLD_OUT
// before its share is sold (undersell). A FromLog restart recounts the log
// and restores exactly the lost units; a FromConfig restart restores the
// whole share, so every unit the node had sold is sold twice. A release or
// expiry that commits and dies before giving its units back loses them the
// same way; rerunning it returns nothing, since the rows have moved
// (TestCrashBeforeGiveBack).
//
// Units in doubt (TestInDoubtInsertSettles). An insert whose connection
// breaks, or whose deadline passes, after it was sent may still commit (a
// server crash, a COMMIT waiting for a synchronous standby). Giving its unit
// back could sell it twice, so the unit stays out of the counter, in doubt,
// and the audit shows it as positive drift until Deployment.Settle reads the
// outcome from the log once the insert's backend is gone (not before: the
// kit's commit-timeout scenario sends requests while COMMITs whose clients
// gave up still wait, and ctl-settle-while-running, which decides early, is
// caught there). The next request
// on any node settles first, so the first request after an outage repairs
// the counters. A release or expiry whose statement (or whose session's
// COMMIT) fails the same way is in doubt too: the rows it moves carry a
// random attempt number, and once its backend is gone Settle gives back the
// units of the rows that carry it, to their nodes unless those restarted
// since (TestReleaseInDoubtSettles; the soak found the units lost before).
//
// Phantom sold-out (TestStrandedShare, TestSessionPhantomSoldOut). A node
// whose share is gone says SOLD_OUT while another node still has units. An
// attempt held open has taken its unit from memory without a committed row,
// so a third request is told SOLD_OUT at once, without waiting; if the
// attempt rolls back, that unit was free after all. A request waiting for
// an attempt with its key or user has taken its unit too, with the same
// effect. Neither strategy claims NoPhantomSoldOut.
//
// Copies of one request sent at once to two nodes, one of which has no unit
// left: the exhausted node waits for a row of the key only once the other
// node's INSERT has started. If it looks before that (the other copy is
// still on its way: in the pool's queue, at its counter), it says SOLD_OUT
// to a key that ends up HELD. Coalescing closes this within a node; across
// nodes it would need the key registered before any counter is touched,
// which is another design. No test shows it, and no scenario of the kit
// sends such copies: duplicate-key never empties a node.
//
// # When C is acceptable
//
// Only where an oversell may be repaired after the fact: a reconciliation
// runs the audit (sales log against stock, per node and in total) and acts on
// its drift. And only where every node, on every start, recovers its
// remaining share from the durable log (memquota-recover), never from its
// configuration. Even then, units lost between a decrement and a log row stay
// lost until the next recovery, and a SOLD_OUT may be wrong while another
// node holds units. What it buys: a SOLD_OUT costs one index lookup and no
// row lock, and the stock is never a hot row.
//
// All nodes of a Deployment live in one process, so a transition on any node
// gives the unit straight back to its owner's counter; nodes in separate
// processes would have to send it there.
//
// The crashes above are shown without fault hooks in the request path:
// Deployment.CrashMidReserve (strategy.ReserveCrasher) runs the decrement
// alone, and the tests make a transition die through export_test.go.
package memquota

import (
	"errors"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

// Name is the name strategy C registers under with FromConfig; the FromLog
// registration appends "-recover" (New).
const Name = "memquota"

// RestartMode says what a node's counters start from when it (re)starts.
type RestartMode int

const (
	// FromConfig starts a node with its configured share, whatever it sold
	// before: the seed's restart oversell.
	FromConfig RestartMode = iota
	// FromLog starts a node with its configured share minus the HELD and
	// CONFIRMED rows it has in the sales log.
	FromLog
)

// Options configure strategy C.
type Options struct {
	// Restart is what a node's counters start from after Deployment.Restart,
	// and in a deployment opened with Meta.Attach.
	Restart RestartMode
	// RestartWithoutDrain is a deliberate mistake, for the negative
	// controls of table 28-1 only (package compare): Restart recounts the
	// log without waiting for the node's requests in flight, so a request
	// that took its unit and commits after the recount has its unit sold
	// again.
	RestartWithoutDrain bool
	// SettleWhileRunning is a deliberate mistake, for the negative controls
	// of table 28-1 only: Settle decides a unit in doubt from the log while
	// the backend that ran its insert is still there, so a COMMIT that is
	// still waiting when Settle reads (the client gave up on it) leaves its
	// unit given back and then sold as well.
	SettleWhileRunning bool
	// FlightByJoinedText is a deliberate mistake, for the negative controls
	// of table 28-1 only: identical requests in flight are recognised by
	// their key, user and SKU joined with ':', so "K:1" by "u" and "K" by
	// "1:u" are merged and the second gets the first's answer.
	FlightByJoinedText bool
	// CommitErrorKeeps is a deliberate mistake, for the negative controls
	// of table 28-1 only: an attempt's COMMIT that fails with anything but
	// the server's rollback keeps its units sold, and records no doubt
	// ("underselling is safe"): an attempt whose backend ended before its
	// COMMIT wrote nothing, and its unit is never sold again.
	CommitErrorKeeps bool
	// GivesBackToMover is a deliberate mistake, for the negative controls
	// of table 28-1 only: a unit a Release or the expiry job moves goes
	// back to the counter of the node that ran it, not the one that sold
	// it (the total stays right): the seller's recount on restart frees
	// the same unit again.
	GivesBackToMover bool
	// ExpirySessionKeepsLast is a deliberate mistake, for the negative
	// controls of table 28-1 only: an expiry job held open keeps only its
	// last run's rows to give back at Commit, so a job run again before it
	// commits (moving nothing) loses the units of the run before.
	ExpirySessionKeepsLast bool
	// SoldOutProbesKeyOnly is a deliberate mistake, for the negative
	// controls of table 28-1 only: a node with no unit that sees the key's
	// hint held waits for the key's row alone (probeSQL), not for the
	// insert that holds the hint, so a resend whose first attempt still
	// waits on the per-user index (no row yet) is answered SOLD_OUT while
	// that attempt goes on to hold.
	SoldOutProbesKeyOnly bool
	// SessionSkipsHint is a deliberate mistake, for the negative controls
	// of table 28-1 only (memquota until 2026-12-06): an attempt held open
	// on a node with no unit waits for the key's row alone (probeSQL), not
	// for an insert of the key that holds its hint, as SoldOutProbesKeyOnly
	// does for every request: a resend inside an attempt held open is
	// answered SOLD_OUT while its first copy waits on the per-user index.
	SessionSkipsHint bool
	// HintWaitBounded is a deliberate mistake, for the negative controls of
	// table 28-1 only: a node with no unit waits for an insert of the key
	// in flight at most hintWaitBound ("an insert is a millisecond's work;
	// a hint held longer belongs to an attempt held open"), then waits for
	// the key's row alone, as SoldOutProbesKeyOnly does at once.
	HintWaitBounded bool
	// TransitionLetsRestart is a deliberate mistake, for the negative
	// controls of table 28-1 only: Release and ExpireDue hold a restart
	// back (d.life) only while they settle doubts, not across their
	// statement and give-back ("a transition changes no counter before it
	// commits"): a FromLog restart between the commit and the give-back
	// recounts the row as free, and the give-back then counts it again.
	TransitionLetsRestart bool
	// CartGivesToLive is a deliberate mistake, for the negative controls of
	// table 28-1 only: a rolled-back attempt held open gives its units to
	// its node as it is now ("after a restart the counters of the node
	// that opened the cart are gone"): a FromLog restart already counted
	// the cart's uncommitted unit as free, and the rollback counts it
	// again.
	CartGivesToLive bool
	// CartGivesToFirstSKU is a deliberate mistake, for the negative
	// controls of table 28-1 only: a rolled-back attempt held open gives
	// every unit it took back to the SKU of its first line.
	CartGivesToFirstSKU bool
	// RestartSkipsOrphans is a deliberate mistake, for the negative
	// controls of table 28-1 only (memquota-recover until 2026-12-06): a
	// FromLog restart recounts the log without waiting for the backends of
	// the node's units in doubt, so an insert whose client gave up and
	// whose COMMIT lands after the recount has its unit sold again.
	RestartSkipsOrphans bool
	// RestartSkipsMoveOrphans is a deliberate mistake, for the negative
	// controls: Restart (FromLog) waits for the backends of the node's
	// inserts in doubt but not for those of the releases and expiries in
	// doubt (memquota-recover until 2026-12-07): a release whose client
	// gave up commits after the recount counted its row HELD, and the
	// settling of moves skips it (its owner restarted), so its unit is
	// never given back.
	RestartSkipsMoveOrphans bool
	// AttachSkipsOrphans is a deliberate mistake, for the negative controls
	// of table 28-1 only (memquota-recover until 2026-12-06): a FromLog
	// Attach recounts the log at once, so an insert of a predecessor that
	// died, still at its COMMIT, has its unit counted free and sold again.
	AttachSkipsOrphans bool
	// RestartCarriesDoubts is a deliberate mistake, for the negative
	// controls of table 28-1 only: a restart hands the node's units in
	// doubt on to the restarted node ("a row that did commit must never be
	// counted free"), although its recount of the log already settled them:
	// Settle later gives the unit of an insert that wrote nothing back a
	// second time.
	RestartCarriesDoubts bool
	// CartBySKU is a deliberate mistake, for the negative controls of table
	// 28-1 only: an attempt held open keeps one line a SKU of what it took
	// ("a cart line is one SKU"), so a cart of two units of one SKU, for
	// two users, gives back one when it rolls back, and the other is lost.
	CartBySKU bool
	// ReplayInCart is a deliberate mistake, for the negative controls of
	// table 28-1 only: an attempt held open keeps a REPLAY among what it
	// took ("the key is in the cart either way"), so its rollback gives the
	// replayed reservation's unit back, though another request holds it.
	ReplayInCart bool
	// KeyReusedInCart is ReplayInCart for a KEY_REUSED answer: an attempt
	// held open keeps it among what it took, and its rollback gives back a
	// unit the refused request never kept.
	KeyReusedInCart bool
	// CommitRollbackIsDoubt is a deliberate mistake, for the negative
	// controls of table 28-1 only: a COMMIT the server turned into a
	// ROLLBACK (a statement of the attempt had failed) is taken for one
	// whose outcome is unknown, and its units stay in doubt while the
	// pooled connection that ran it lives.
	CommitRollbackIsDoubt bool
	// KeyHintFolded is a deliberate mistake, for the negative controls of
	// table 28-1 only: an insert takes its key's hint under the key's
	// lower case ("keys are case-insensitive anyway"), so a node with no
	// unit left that probes for a request whose key is that lower case
	// waits for another user's attempt held open.
	KeyHintFolded bool
	// AttemptsCounted is a deliberate mistake, for the negative controls of
	// table 28-1 only: inserts and moves are numbered by a counter of the
	// process from 1, so a process that attached after another settles a
	// release in doubt by a number the other one used, and gives back the
	// other's unit too.
	AttemptsCounted bool
	// MovesToRestarted is a deliberate mistake, for the negative controls
	// of table 28-1 only: Settle gives the unit of a release in doubt to
	// the node running now, even when that node restarted since and its
	// recount of the log already counted the unit.
	MovesToRestarted bool
	// RollbackGivesBack is a deliberate mistake, for the negative controls
	// of table 28-1 only: an expiry job held open that is rolled back gives
	// back the units of the rows it had moved, as if it had committed; the
	// rows stay HELD and their units are sold again.
	RollbackGivesBack bool
	// RecountEvenShare is a deliberate mistake, for the negative controls
	// of table 28-1 only: a restarted node recounts from an even split of
	// the SKU's total (strategy.ShareOf) instead of its configured share,
	// so a node whose share was smaller sells what another node holds.
	RecountEvenShare bool
	// RecountSkipsDue is a deliberate mistake, for the negative controls of
	// table 28-1 only: a restarted node recounts only the HELD rows whose
	// expires_at has not passed, so a due reservation no job has moved yet
	// has its unit sold again, and its late payment then confirms it too.
	RecountSkipsDue bool
	// RecountRecentOnly is a deliberate mistake, for the negative controls
	// of table 28-1 only: a restarted node recounts only the sales of the
	// last 48 hours ("a hold lives at most a day"), so a unit paid for
	// longer ago than that is sold again.
	RecountRecentOnly bool
	// RecountCountsExpired is a deliberate mistake, for the negative
	// controls of table 28-1 only: a FromLog restart counts the node's
	// EXPIRED sales as held ("status <> 'RELEASED'"), so every unit the
	// expiry job gave back is lost at the next restart.
	RecountCountsExpired bool
	// RestartFallsBack is a deliberate mistake, for the negative controls
	// of table 28-1 only: a restart whose recount of the sales log fails
	// (a lock, a timeout) starts the node from its share of the total
	// instead of failing ("a node that will not start is worse").
	RestartFallsBack bool
	// AuditFromLog is a deliberate mistake, for the negative controls of
	// table 28-1 only: Audit reports each node's available as its share
	// minus its active rows in the log ("reproducible from the database
	// alone"), not its live counter, so a unit lost from memory shows as
	// available and no drift.
	AuditFromLog bool
	// GiveUpIsRollback is a deliberate mistake, for the negative controls
	// of table 28-1 only: a session's COMMIT that fails because its caller
	// gave up is taken for a rollback ("a cancelled statement does not
	// happen"), and its units go back to the counter, though the COMMIT
	// may have happened.
	GiveUpIsRollback bool
	// SettleByKey is a deliberate mistake, for the negative controls of
	// table 28-1 only: Settle looks for a unit in doubt's row by its key
	// alone, not its key and attempt, so a row another attempt of the same
	// key committed keeps the unit of an insert that wrote nothing.
	SettleByKey bool
	// SettleActiveOnly is a deliberate mistake, for the negative controls
	// of table 28-1 only: settling a unit in doubt counts its insert as
	// committed only if its row is still HELD or CONFIRMED ("a doubt holds
	// its unit only while its row is active"): a request given up on that
	// committed and was released before its backend ended has its unit
	// given back a second time (outsider round 38's m5).
	SettleActiveOnly bool
	// ZeroShareIsUnset is a deliberate mistake, for the negative controls
	// of table 28-1 only: a node's share of 0 in strategy.Stock.Shares is
	// read as "not set", and the node gets the even split.
	ZeroShareIsUnset bool
	// CeilShare is a deliberate mistake, for the negative controls of
	// table 28-1 only: the even split gives each node but the last
	// ceil(total/nodes) units and the last the rest, which on 3 or more
	// nodes adds up to more than the total.
	CeilShare bool
	// CheckThenTake is a deliberate mistake, for the negative controls of
	// table 28-1 only: the counter checks that a unit is left, then takes
	// it, in two atomic steps instead of one compare-and-swap, so two
	// requests can both take the last unit.
	CheckThenTake bool
	// SessionFailKeepsDoubt is a deliberate mistake, for the negative
	// controls of table 28-1 only: an insert that fails inside an attempt
	// held open is treated as a plain one's, so a failure whose fate a
	// plain request could not know (its caller gave up) keeps the unit in
	// doubt, though a failed statement in a transaction never commits: the
	// unit is lost until a restart.
	SessionFailKeepsDoubt bool
	// PutBackAfterLookup is a deliberate mistake, for the negative control
	// ctl-put-back-after-lookup only: a unit taken for an insert that the
	// key's or the user's index refused goes back to the counter only once
	// the lookup that answers the request has succeeded, so a caller that
	// gives up between the two loses the unit (outsider round 41's
	// memquota-recover).
	PutBackAfterLookup bool
}

func (o Options) validate() error {
	if o.Restart != FromConfig && o.Restart != FromLog {
		return fmt.Errorf("%w: unknown restart mode %d", strategy.ErrConfig, o.Restart)
	}
	return nil
}

// errCrashed is what a reserve returns when Deployment.CrashMidReserve made
// it "die" between memory and the database (and, in this package's tests, a
// transition made to die the same way: export_test.go). To the caller it is
// an unknown outcome, like any error.
var errCrashed = errors.New("memquota: died between the database and memory (fault injection)")

const (
	// What both registrations claim. While no node restarts, neither
	// oversells nor drifts (TestContention, the kit's scenarios); the
	// harness charges what the audit finds after a restart to
	// SurvivesRestart.
	baseClaims = strategy.NoOversell | strategy.Conserves | strategy.IdempotentKey | strategy.OneActivePerUser |
		strategy.ReturnOnce | strategy.NoWait | strategy.LeastPrivilege

	// ConfigClaims are the claims of memquota (FromConfig): not
	// SurvivesRestart, because a restart from the configured share sells the
	// node's units twice (the restart scenario, TestRestartOversell).
	ConfigClaims = baseClaims
	// LogClaims are the claims of memquota-recover (FromLog).
	LogClaims = baseClaims | strategy.SurvivesRestart
)

// Meta is the registered strategy "memquota": FromConfig.
func Meta() strategy.Meta { return New(Options{}) }

// New returns the strategy.Meta of strategy C with these options: named
// Name ("memquota") for FromConfig and "memquota-recover" for FromLog; the
// package registers both.
func New(opts Options) strategy.Meta {
	m := strategy.Meta{
		Name:        Name,
		Description: "per-node share counted in memory, decremented first, then a sales-log row; restart from config",
		Correctness: "node shares sum to the stock and the in-memory counters are never lost",
		Claims:      ConfigClaims,
		// One INSERT in autocommit decides nothing: the node's counter
		// decided first.
		Isolation: "read committed",
		Retry:     "none: an insert of unknown fate keeps its unit in doubt until the node settles it",
	}
	if opts.Restart == FromLog {
		m.Name = Name + "-recover"
		m.Description = "per-node share counted in memory, decremented first, then a sales-log row; restart from the log"
		m.Correctness = "node shares sum to the stock and a restarted node's counter is recomputed from the sales log on start"
		m.Claims = LogClaims
	}
	m.Open = pgstrategy.Bind(Open, opts)
	m.Attach = pgstrategy.Bind(attach, opts)
	m.Setup = schema.Setup
	return m
}

func init() {
	strategy.Register(Meta())
	strategy.Register(New(Options{Restart: FromLog}))
}
