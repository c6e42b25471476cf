package strategytest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// KindDeploymentContract runs the checks of the deployment's own contract,
// beside the reservations: configs, Audit, Attach, Node, Restart and
// held-open sessions. As a scenario they reach table 28-1 and every run of
// go test ./compare, not only a strategy's own conformance test.
const KindDeploymentContract = "deployment-contract"

func init() {
	registerKind(KindDeploymentContract, kindSpec{run: runDeploymentContract, required: []string{}})
}

// tester is the part of testing.T the contract checks use: *testing.T in a
// test, a recorder (below) in a scenario.
type tester interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Fatal(args ...any)
	Logf(format string, args ...any)
	Skip(args ...any)
}

// runDeploymentContract runs checkConfig, checkExpiryTiming, checkTTLAcrossDST, checkTTLMicroseconds,
// checkConfirmTiming, checkJustPast, checkSession, checkUnitsPerSKU,
// checkAnswersWhenSoldOut, checkAnswersInAnyPlanOrder, checkLateConflictsInAnyPlanOrder, checkConflictEndsBeforeLookup, checkExpiryCommitLost, checkSessionDiesBeforeCommit, checkExpiredByOtherNodeThenRestart, checkKeyOnItsWay, checkTransitionMovesOneKey,
// checkDueHoldsItsUnit, checkDueReleases,
// checkExpireAllDue,
// checkOddText, checkDistinctText, checkHashCollisions,
// checkWaitOutlastsTimeouts, checkServerCancelsWait and, for a
// strategy that claims no-wait, checkNoWaitBehindLockedRows on
// deployments of their own
// (kit SKUs, beside the trial's), each failure a failed check of the
// contract.
func runDeploymentContract(ctx context.Context, t *trial) error {
	rs := t.env.Resources.Addrs()
	type part struct {
		what  string
		run   func(tester)
		claim strategy.Claims // Base: the contract itself
		name  string          // what Env.Checks and a control's expectation call it
	}
	var behind conflictBehind
	var refused outlastRefusals
	var jump redisJump
	var keyLost redisKeyLost
	var fresh freshDatabase
	parts := []part{
		{"a bad config is refused with ErrConfig and writes nothing; a SKU opens once; Confirm, Release, ExpireDue and MakeDue touch only the deployment's SKUs; Audit, Attach, Node and Restart keep their contract; a restarted or closed node answers ErrNodeClosed to every call",
			func(r tester) { checkConfig(r, t.env.Meta, t.env.DB, rs) }, Base, "checkConfig"},
		{"a request whose lock another takes while it waits in PostgreSQL, for longer than its watchdog's renewal, answers what it stored: HELD when its reservation is, not HELD when it is not",
			func(r tester) { checkLockLostWhileWorking(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkLockLostWhileWorking"},
		{"a request waiting for its SKU's lock outside PostgreSQL, given up by its caller, leaves the lock's key as its holder set it",
			func(r tester) { checkGivenUpLeavesLock(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkGivenUpLeavesLock"},
		{"a request reports waiting for its SKU's lock outside PostgreSQL (strategy.LockWait) only while another holds it: not on its way to a free lock, not once it has answered",
			func(r tester) { checkLockWaitReported(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkLockWaitReported"},
		{"the expiry job moves exactly the reservations whose expires_at had passed, and counts them",
			func(r tester) { checkExpiryTiming(r, t.env.Meta, t.env.DB, rs) }, Base, "checkExpiryTiming"},
		{"a reservation held for 18 h or a day, in a session whose time zone changes to daylight saving time 12 h later, expires exactly its TTL after it was made",
			func(r tester) { checkTTLAcrossDST(r, t.env.Meta, t.env.DB, rs) }, Base, "checkTTLAcrossDST"},
		{"a TTL is kept to the microsecond: three reservations made one after the other (in one attempt held open, where the strategy has them), TTL 1 h plus 1, 600 and 999 µs, are stored at least their TTLs' differences apart, which no rounding to milliseconds keeps",
			func(r tester) { checkTTLMicroseconds(r, t.env.Meta, t.env.DB, rs) }, Base, "checkTTLMicroseconds"},
		{"ConfirmBeforeExpiry confirms a reservation exactly while its expires_at has not passed",
			func(r tester) { checkConfirmTiming(r, t.env.Meta, t.env.DB, rs) }, Base, "checkConfirmTiming"},
		{"a held-open attempt is invisible until Commit and gone after Rollback; an ended session refuses more; a session refuses what Reserve refuses, another deployment's SKU included",
			func(r tester) { checkSession(r, t.env.Meta, t.env.DB, rs) }, Base, "checkSession"},
		{"each released or expired unit, and each unit of a cart rolled back, goes back to the SKU it was sold from, and sells there again; a confirm delivered twice moves the row once",
			func(r tester) { checkUnitsPerSKU(r, t.env.Meta, t.env.DB, rs) }, Base, "checkUnitsPerSKU"},
		{"a node that has just answered SOLD_OUT still answers a known key REPLAY (which changes nothing, not even expires_at) or KEY_REUSED (also from a user who holds the SKU under another key), and USER_LIMIT only for the SKU its user holds; a unit released through another node is HELD on it when no phantom sold-out is claimed",
			func(r tester) { checkAnswersWhenSoldOut(r, t.env.Meta, t.env.DB, rs) }, Base, "checkAnswersWhenSoldOut"},
		{"a user whose reservation of a SKU of one unit was released, or expired by the job, asking again after another user took the unit is answered SOLD_OUT, not USER_LIMIT",
			func(r tester) { checkEndedHolderWhenSoldOut(r, t.env.Meta, t.env.DB, rs) }, Base, "checkEndedHolderWhenSoldOut"},
		{"an attempt held open that reserved a unit of a SKU of 2, then a second whose caller gave up while its write waited, and rolled back, leaves both units to sell",
			func(r tester) { checkSessionInsertGivenUp(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkSessionInsertGivenUp"},
		{"a crowd of requests for one SKU sent at once to one node (every answer a SKU with units gives, shuffled) gets each its own answer while the server joins by sorting, so rows come back in another order than requests went in",
			func(r tester) { checkAnswersInAnyPlanOrder(r, t.env.Meta, t.env.DB, rs) }, Base, "checkAnswersInAnyPlanOrder"},
		{"requests for one SKU whose keys are taken by attempts in flight on other SKUs, which commit while the requests wait for them, get each its own answer while the server joins by sorting: KEY_REUSED with the reservation of its own key's owner",
			func(r tester) { checkLateConflictsInAnyPlanOrder(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkLateConflictsInAnyPlanOrder"},
		{"a transition moves only the reservation of its key: confirming or releasing one of a user's reservations leaves the user's others, and other users', as they were",
			func(r tester) { checkTransitionMovesOneKey(r, t.env.Meta, t.env.DB, rs) }, Base, "checkTransitionMovesOneKey"},
		{"keys, users and SKUs of any valid text (quotes, backslashes, % and _, non-ASCII, the longest allowed) are stored and found as sent",
			func(r tester) { checkOddText(r, t.env.Meta, t.env.DB, rs) }, Base, "checkOddText"},
		{"SKUs that differ only in a separator (':', '_', '-', ' ', '.', '/', none) or a hash tag's braces are separate stock: each sells exactly its own total",
			func(r tester) { checkSKUsApartByMarks(r, t.env.Meta, t.env.DB, rs) }, Base, "checkSKUsApartByMarks"},
		{"a HELD reservation past its expires_at keeps its unit until a transition moves it: its user is refused the SKU under a new key, and selling around it (after a restart of its node, where survives-restart is claimed), then its late payment, oversells nothing",
			func(r tester) { checkDueHoldsItsUnit(r, t.env.Meta, t.env.DB, rs) }, Base, "checkDueHoldsItsUnit"},
		{"a HELD reservation past its expires_at that no transition has moved is still its holder's to release: one unit back, and a late payment then confirms nothing",
			func(r tester) { checkDueReleases(r, t.env.Meta, t.env.DB, rs) }, Base, "checkDueReleases"},
		{"a deployment whose nodes run an expiry job (strategy.Expirer) offers MakeDue (strategy.Ager): without it every check of the job with a due row is skipped",
			func(r tester) { checkExpirerAges(r, t.env.Meta, t.env.DB, rs) }, Base, "checkExpirerAges"},
		{"MakeDue leaves the reservations it moves HELD, with expires_at 400 days in the past (strategy.Ager), not a moment ago: the checks of jobs that look back over a window rely on it",
			func(r tester) { checkMakeDueFarBack(r, t.env.Meta, t.env.DB, rs) }, Base, "checkMakeDueFarBack"},
		{"a plain request beside an attempt held open on the last unit (also one that reserved another SKU first) waits or is refused, and one reservation holds the unit",
			func(r tester) { checkPlainBesideSession(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkPlainBesideSession"},
		{"one attempt held open reserves 2 units of a SKU of 4 (one sold before), for two users, with nobody else asking, sends the sold key again (REPLAY), and rolls back: both units come back, none for the REPLAY; another does the same: HELD twice, then REPLAY of its first key and USER_LIMIT for a new key of that user, then HELD for the last unit and SOLD_OUT for one more, and all three hold once it commits",
			func(r tester) { checkTwoOfOneSKUInSession(r, t.env.Meta, t.env.DB, rs) }, Base, "checkTwoOfOneSKUInSession"},
		{"the same where the database's default isolation is REPEATABLE READ (a DBA's ALTER DATABASE ... SET default_transaction_isolation): a strategy written for READ COMMITTED says so in its BEGIN, its attempts held open too (one asks for a SKU a plain request took a unit of after its first statement: HELD, and its COMMIT keeps both)",
			func(r tester) { checkAtDefaultIsolation(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkAtDefaultIsolation"},
		{"two requests waiting together behind an attempt that commits a reservation for the first one's user: the first is refused, the second gets the unit that is left (never SOLD_OUT while a unit is left)",
			func(r tester) { checkConflictCommitsWhileWaiting(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoPhantomSoldOut, "checkConflictCommitsWhileWaiting"},
		{"a request refused by a unique index for its user's reservation, released before the strategy's next statement asks why (held by the kit's tracer), is USER_LIMIT or HELD, never SOLD_OUT while units are free",
			func(r tester) { checkConflictEndsBeforeLookup(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoPhantomSoldOut, "checkConflictEndsBeforeLookup"},
		{"a request for a SKU of 2 units, one free and the other being given back by an expiry job held open, is HELD once the job commits, never SOLD_OUT",
			func(r tester) { checkRequestBehindGiveBack(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoPhantomSoldOut, "checkRequestBehindGiveBack"},
		{"a unit sold on one node and expired by the job on another goes back once: after the seller restarts, a SKU of 2 units (shares [1, 1]) sells at most 2",
			func(r tester) { checkExpiredByOtherNodeThenRestart(r, t.env.Meta, t.env.DB, rs) }, strategy.SurvivesRestart, "checkExpiredByOtherNodeThenRestart"},
		{"an attempt held open whose backend ends before its COMMIT wrote nothing: on a SKU of 1 unit, Commit fails and a new user is HELD",
			func(r tester) { checkSessionDiesBeforeCommit(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.Conserves, "checkSessionDiesBeforeCommit"},
		{"an expiry job whose COMMIT is lost (its backend ended while the kit's tracer held the COMMIT) gives back nothing: on a SKU of 1 unit, at most 1 reservation is active after it, and after the job runs again",
			func(r tester) { checkExpiryCommitLost(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkExpiryCommitLost"},
		{"a request whose client gave up while it waited behind its own twin, an attempt held open on another node that then commits, is resolved by its own attempt: no unit lost, none sold twice, also where its node restarts (survives-restart claimed) before the twin commits",
			func(r tester) { checkTwinUnknown(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.Conserves, "checkTwinUnknown"},
		{"Confirm and Release of a HELD reservation whose row another transaction holds wait for it, and move the reservation when it rolls back",
			func(r tester) { checkTransitionsWaitForLockedRows(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkTransitionsWaitForLockedRows"},
		{"a request that waits behind an attempt held open, which then commits its key (for another SKU, or its twin), its key by another user, or its user's reservation of the SKU, is answered KEY_REUSED, REPLAY or USER_LIMIT",
			func(r tester) { behind.run(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkConflictBehind"},
		{"a request that met a conflict committed while it waited takes no unit: every unit of those SKUs is in a reservation or available",
			behind.audit, strategy.Conserves, "checkConflictBehind"},
		{"a Confirm and a Release keep the expires_at the reservation was made with: Lookup reads the one its HELD answer carried",
			func(r tester) { checkTransitionKeepsDeadline(r, t.env.Meta, t.env.DB, rs) }, Base, "checkTransitionKeepsDeadline"},
		{"an attempt held open asks again for a SKU one of whose units was released outside it since: HELD, not SOLD_OUT",
			func(r tester) { checkSessionSeesGiveBack(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoPhantomSoldOut, "checkSessionSeesGiveBack"},
		{"two attempts held open, each holding a unit of one SKU, ask for the other's SKU: the request a deadlock ends is answered BUSY or an error, never SOLD_OUT, USER_LIMIT, KEY_REUSED or REPLAY",
			func(r tester) { checkDeadlockVictim(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkDeadlockVictim"},
		{"an attempt held open whose second request fails in the server, then committed, keeps its first reservation whole or not at all, and the SKU then sells every unit no reservation holds",
			func(r tester) { checkSessionStatementFails(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkSessionStatementFails"},
		{"a plain request that waits for a key an attempt held open holds on another SKU, while that attempt asks for the request's SKU, is answered an error, BUSY, KEY_REUSED or HELD, never SOLD_OUT, USER_LIMIT or REPLAY",
			func(r tester) { checkPlainDeadlockVictim(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkPlainDeadlockVictim"},
		{"a key whose reservation ended is known once its SKU is sold out too: sent again by its owner it is REPLAY of the ended reservation, by another user, also one who holds the SKU, KEY_REUSED",
			func(r tester) { checkEndedKeyWhenSoldOut(r, t.env.Meta, t.env.DB, rs) }, Base, "checkEndedKeyWhenSoldOut"},
		{"a Lookup, Confirm, Release or expiry job (with a reservation due) that waits behind tables another transaction has locked until its caller cancels it, or until its deadline passes, returns an error, not NOT_FOUND, false or 0; so do a Restart and an Attach",
			func(r tester) { checkBlockedCallsFail(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkBlockedCallsFail"},
		{"a request waiting behind the strategy's locked tables, given up by its caller, leaves nothing waiting 5 s later where Config.InternalDeadline is 300 ms: work no caller bounds ends by it",
			func(r tester) { checkInternalDeadlineKept(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkInternalDeadlineKept"},
		{"an expiry job, a Release or a Confirm that waits behind an attempt held open on its SKU (another key), which then commits, moves its reservation once and reports it: one unit given back, or true",
			func(r tester) { checkTransitionsBehindAttempt(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkTransitionsBehindAttempt"},
		{"an expiry job run while an attempt is held open on a SKU where nothing is due (waiting for it, if it does) gives nothing back and leaves the count as the attempt's commit makes it: one unit in one reservation",
			func(r tester) { checkExpiryBesideAttempt(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.Conserves, "checkExpiryBesideAttempt"},
		{"an expiry job run on every node, and a Release of another reservation, while a request is on its way (its unit taken, its row not yet written) take nothing from it: the SKU sells its 2 units, no more",
			func(r tester) { checkMovesBesideInsert(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkMovesBesideInsert"},
		{"a second user's request for a key whose first request's row is on its way (for the same SKU, then another) waits, or is BUSY or an error, or KEY_REUSED with the owner as stored once the row is there; the user whose row went in is HELD, and a user refused the key is HELD under a new key",
			func(r tester) { checkKeyOnItsWay(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkKeyOnItsWay"},
		{"a request whose every write fails with a serialization failure (40001) is answered BUSY or an error, never SOLD_OUT, on a SKU with units; once its writes go through it is HELD, and the failed attempts took nothing; a Confirm or a Release whose writes fail so returns an error, never false or 0",
			func(r tester) { checkWritesKeepFailing(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkWritesKeepFailing"},
		{"a Release, an expiry run, a Confirm and a Reserve whose first COMMIT fails with a serialization failure (40001) answer for the attempt that committed: 1 unit, 1 unit, true, HELD (or, answered an error, their resend does); the audit shows no drift",
			func(r tester) { checkRetriedAtCommit(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkRetriedAtCommit"},
		{"a request whose every insert of a row naming its key does nothing (as ON CONFLICT DO NOTHING beside a row its snapshot cannot see) is never answered SOLD_OUT on a SKU with units, also inside an attempt held open",
			func(r tester) { checkWritesSkipped(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoPhantomSoldOut, "checkWritesSkipped"},
		{"a process that attaches while an attempt is held open on the stock changes nothing that attempt commits: the SKU sells no more than its total",
			func(r tester) { checkAttachBesideAttempt(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkAttachBesideAttempt"},
		{"a process that attaches with the same stock listed in another order, and reserves beside an attempt held open in the first on the last unit of a SKU, sells no more than its total",
			func(r tester) { checkAttachedInOtherOrder(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkAttachedInOtherOrder"},
		{"the twin of a request for a SKU's last unit, held on its way to Redis until the request has committed, answers REPLAY (a known key first), never SOLD_OUT",
			func(r tester) { checkTwinBehindRedis(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkTwinBehindRedis"},
		{"a late payment or a release of a due reservation, held in PostgreSQL once it has locked the row while the expiry job runs, then committed, leaves the reservation CONFIRMED or RELEASED: the job, which waited for the row or skipped it, moves nothing and gives nothing back for it",
			func(r tester) { checkJobBehindTransition(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkJobBehindTransition"},
		{"an expiry job held open and rolled back moves nothing and gives nothing back; committed, it returns each unit once",
			func(r tester) { checkExpirySessionRollback(r, t.env.Meta, t.env.DB, rs) }, Base, "checkExpirySessionRollback"},
		{"a node whose configured share of a SKU is 0 sells none of it: three nodes with shares [0, 3, 0] sell at most 3",
			func(r tester) { checkZeroShare(r, t.env.Meta, t.env.DB, rs) }, strategy.NoOversell, "checkZeroShare"},
		{"a SKU of 70,001 units (more than 16 bits count) opens, sells a unit and takes it back, counted exactly",
			func(r tester) { checkBigTotal(r, t.env.Meta, t.env.DB, rs) }, Base, "checkBigTotal"},
		{"stock split evenly over 3, 4 or 5 nodes gives each node its strategy.ShareOf and sells at most the total",
			func(r tester) { checkEvenSplit(r, t.env.Meta, t.env.DB, rs) }, strategy.NoOversell, "checkEvenSplit"},
		{"keys, users and SKUs that differ only in case, spaces at either end, Unicode normal form or compatibility form (width, ligatures), a dash or a character of no width, a UUID's spelling, or as aliases of one e-mail inbox are different, and a key that matches another as a LIKE, glob or regular-expression pattern is another key; on a sold-out SKU, a user or key that differs from a holder's only so is SOLD_OUT, also inside an attempt held open",
			func(r tester) { checkDistinctText(r, t.env.Meta, t.env.DB, rs) }, Base, "checkDistinctText"},
		{"keys, users and SKUs are whole values: a user whose name joined to a SKU reads like another user's with another SKU, keys and users that share a long prefix, and a SKU with a comma are each their own",
			func(r tester) { checkJoinedText(r, t.env.Meta, t.env.DB, rs) }, Base, "checkJoinedText"},
		{"two requests in flight at once whose key and user joined with ':' read the same (K:1 by u, K by 1:u), each behind its twin held open, get each its own answer",
			func(r tester) { checkJoinedTextInFlight(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkJoinedTextInFlight"},
		{"a request that waits behind its user's attempt held open, sent again through a node with no unit of the SKU (of the same process, of a second one that attached, and inside an attempt held open there), is one request: once the attempt rolls back, one HELD and one REPLAY, never SOLD_OUT",
			func(r tester) { checkResendBehindUser(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkResendBehindUser"},
		{"a SKU of 1 unit reserved and released by one process, then by a second that attached, whose release is cut once the server ran it, sells 1 unit again: the second settles only its own",
			func(r tester) { checkCutReleaseInNewProcess(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkCutReleaseInNewProcess"},
		{"a request that died mid-reserve on node 0, sent again through node 1 and written while node 0 restarts, keeps its unit: the SKU of 1 unit sells no more",
			func(r tester) { checkCrashedResentDuringRestart(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkCrashedResentDuringRestart"},
		{"a request in flight on node 0, sent again through node 1 and given up, and node 1 restarted before the first is written: the SKU of 1 unit sells no more",
			func(r tester) { checkResendGivenUpThenRestarted(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkResendGivenUpThenRestarted"},
		{"where survives-restart is claimed, a node that restarts after a Release, then an expiry job, of its reservation committed and before the call had its answer sells the unit once",
			func(r tester) { checkRestartBeforeAnswer(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.SurvivesRestart, "checkRestartBeforeAnswer"},
		{"a node restarted while a request it gave up on is still committing (its cancel lost) oversells nothing: after that COMMIT goes through, a SKU of one unit has at most one active reservation",
			func(r tester) { checkRestartBesideOrphan(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.SurvivesRestart, "checkRestartBesideOrphan"},
		{"a node restarted while a Release it gave up on is still committing (its cancel lost) loses no unit: after that COMMIT goes through, a SKU of one unit sells its unit to a new user",
			func(r tester) { checkRestartBesideMoveOrphan(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.SurvivesRestart, "checkRestartBesideMoveOrphan"},
		{"a request given up on (its cancel and its close lost) that commits, is released, and only then loses its backend is counted as committed: a SKU of one unit then sells one more, not two",
			func(r tester) { checkOrphanReleasedBeforeGone(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoOversell, "checkOrphanReleasedBeforeGone"},
		{"a successor process that attaches while a request its dead predecessor gave up on is still committing oversells nothing: after that COMMIT goes through, a SKU of one unit has at most one active reservation",
			func(r tester) { checkAttachBesideOrphan(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.SurvivesRestart, "checkAttachBesideOrphan"},
		{"where survives-restart is claimed, two attempts held open on a node while it restarts, then one rolled back and one committed, leave each SKU selling its unit once",
			func(r tester) { checkSessionAcrossRestart(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.SurvivesRestart, "checkSessionAcrossRestart"},
		{"three requests for a SKU reach a node while their writes wait, and the callers of the first two give up: the third, whose caller did not, gets HELD (or BUSY), not an error",
			func(r tester) { checkOthersGiveUp(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkOthersGiveUp"},
		{"after the clock of the strategy's Redis jumps past every TTL (keys with one deleted, holds made due), a SKU sold out and paid for sells nothing more",
			func(r tester) {
				jump.run(r, t.env.Meta, t.env.DB, t.env.Resources)
				jump.judge(r, jump.oversold, "sold again after the jump", "the jump of Redis's clock did not run")
			}, strategy.NoOversell, "checkRedisClockJump"},
		{"after the clock of the strategy's Redis jumps past every TTL, a due hold released (or expired) gives its unit back: every unit is in a reservation or available",
			func(r tester) {
				jump.judge(r, jump.unconserved, "a unit lost after the jump", "the jump of Redis's clock did not run")
			}, strategy.Conserves, "checkRedisClockJump"},
		{"a strategy whose Redis may evict (no maxmemory-policy noeviction in its Needs) that loses any one key it wrote for a SKU with two units held, then releases one, sells no more than the stock",
			func(r tester) {
				keyLost.run(r, t.env.Meta, t.env.DB, t.env.Resources)
				keyLost.judge(r, keyLost.oversold, "sold again after a key was lost", keyLost.notRun())
			}, strategy.NoOversell, "checkRedisKeyLost"},
		{"the same: every unit is in a reservation or available",
			func(r tester) {
				keyLost.judge(r, keyLost.unconserved, "a unit lost after a key was lost", keyLost.notRun())
			}, strategy.Conserves, "checkRedisKeyLost"},
		{"two holders of a SKU's lock that overlap (the first one's lock dropped before its commit) on a SKU of 3 units leave every unit in a reservation or available",
			func(r tester) { checkLockLostUpdate(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.Conserves, "checkLockLostUpdate"},
		{"a request (the resend of a HELD key, or a new one) whose k-th statement fails, or whose caller gives up once its k-th statement ended, for each k in turn, is answered REPLAY or HELD, BUSY or an error, and once sent again leaves every unit in a reservation or available",
			func(r tester) { checkResendAtEachStatement(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.Conserves, "checkResendAtEachStatement"},
		{"a request whose key an attempt held open took with the SKU's last unit, waiting behind that attempt, is answered about its key once the attempt commits (KEY_REUSED, or REPLAY for the same request), never SOLD_OUT",
			func(r tester) { checkKeyBehindLastUnit(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkKeyBehindLastUnit"},
		{"the twin of a request held open, paused after each of its statements in turn while the request commits, is REPLAY",
			func(r tester) { checkTwinBetweenStatements(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkTwinBetweenStatements"},
		{"a new request for a SKU whose one unit is held, paused after each of its statements in turn while the holder releases the unit, is HELD or SOLD_OUT, also inside an attempt held open",
			func(r tester) { checkUnitBackBetweenStatements(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkUnitBackBetweenStatements"},
		{"a new request that waits behind an attempt held open with the SKU's last unit is not answered SOLD_OUT once the attempt rolls back",
			func(r tester) { checkNewBehindLastUnitRolledBack(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoPhantomSoldOut, "checkNewBehindLastUnitRolledBack"},
		{"a resend is REPLAY of the reservation's current state after another node or another process released or confirmed it",
			func(r tester) { checkReplayAfterMovedElsewhere(r, t.env.Meta, t.env.DB, rs) }, Base, "checkReplayAfterMovedElsewhere"},
		{"a caller that gives up once its request's COMMIT went through (the strategy's Redis writes paused, when it has one) is answered HELD or an error, never BUSY or another answer that says nothing was written",
			func(r tester) { checkGivenUpAfterCommit(r, t.env.Meta, t.env.DB, t.env.Admin, t.env.Resources) }, Base, "checkGivenUpAfterCommit"},
		{"a SKU opened in a fresh database on the same resources (Redis) as an earlier one sells what the new stock says, not the earlier count: no more",
			func(r tester) {
				fresh.run(r, t.env.Meta, t.env.DB, t.env.Admin, rs)
				fresh.judge(r, fresh.oversold, "the earlier database's count sold", "the fresh database on the same resources was not checked")
			}, strategy.NoOversell, "checkFreshDatabase"},
		{"a SKU opened in a fresh database on the same resources as an earlier one sells its whole new stock: every unit is in a reservation or available",
			func(r tester) {
				fresh.judge(r, fresh.unconserved, "the earlier database's count kept", "the fresh database on the same resources was not checked")
			}, strategy.Conserves, "checkFreshDatabase"},
		{"the twin of a request for a SKU's last unit, or for a unit of two, made to wait in PostgreSQL at its first read of each table in turn while the request commits, answers REPLAY (a known key first), never SOLD_OUT or USER_LIMIT",
			func(r tester) { checkTwinBehindTableLock(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkTwinBehindTableLock"},
		{"an Audit that waits, after its first read, while a sale commits balances: one snapshot (for a strategy whose whole state is in PostgreSQL)",
			func(r tester) { checkAuditOneSnapshot(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkAuditOneSnapshot"},
		{"two SKUs are two stocks however alike their names: SKUs whose CRC-32, CRC-32C, FNV or String.hashCode are equal, and two of the longest length that differ in the last byte, each sell exactly their own total",
			func(r tester) { checkSKUsApart(r, t.env.Meta, t.env.DB, rs) }, Base, "checkSKUsApart"},
		{"1,000 days later (every time stored for a SKU moved 1,000 days back, node 0 restarted where it claims to survive it, the expiry job run), a paid unit stays sold, the others sell once more, and every old key is still its own, found by Lookup",
			func(r tester) { checkYearsLater(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkYearsLater"},
		{"an Audit's Available is what then sells: after a sale (and, for a strategy that counts stock in a node's memory, a request that died mid-reserve), exactly that many units are HELD before SOLD_OUT",
			func(r tester) { checkAuditIsWhatSells(r, t.env.Meta, t.env.DB, rs) }, Base, "checkAuditIsWhatSells"},
		{"one user holds a unit of each of 64 SKUs at once: the limit is one active reservation per user and SKU, none across SKUs",
			func(r tester) { checkOneUserManySKUs(r, t.env.Meta, t.env.DB, rs) }, Base, "checkOneUserManySKUs"},
		// The costly checks (a wait for the clock, a lock held for seconds,
		// hundreds or thousands of requests) come after the others: a
		// scenario told to stop at its first violation (StopOnViolation)
		// without Env.Checks does not pay for them when a cheap check
		// has already failed.
		{"a request that waits behind an attempt held open on its SKU, its key or its user, which then rolls back (without sessions: behind rows another transaction holds), longer than any lock or statement timeout the strategy set (at least 6 s), is not answered SOLD_OUT while its SKU has units: a strategy that gives up answers BUSY or unknown",
			func(r tester) { checkWaitOutlastsTimeouts(r, t.env.Meta, t.env.DB, t.env.Admin, rs, &refused) }, strategy.NoPhantomSoldOut, "checkWaitOutlastsTimeouts"},
		{"a request whose statement the server cancels (a statement_timeout of 400 ms a DBA set for the role) while it waits behind an attempt held open on its SKU, its key or its user (without sessions: behind rows another transaction holds) is not answered SOLD_OUT while its SKU has units",
			func(r tester) { checkServerCancelsWait(r, t.env.Meta, t.env.DB, t.env.Admin, rs, &refused) }, strategy.NoPhantomSoldOut, "checkServerCancelsWait"},
		{"nor is a request behind those holds answered USER_LIMIT, KEY_REUSED or REPLAY: its key and its user held nothing but the attempt that rolled back",
			refused.report, Base, "checkOutlastRefusals"},
		{"a resend of a request that waits behind its user's attempt held open, longer than any timeout the strategy set and at least 6 s, is answered as one request with the first: REPLAY when the first holds, never SOLD_OUT",
			func(r tester) { checkResendOutlastsTimeouts(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkResendOutlastsTimeouts"},
		{"a Confirm and a Release of HELD reservations whose rows another transaction holds for at least 6 s (and past any timeout the strategy set), which then rolls back, move them, or give up with an error: never false or 0",
			func(r tester) { checkMovesOutlastTimeouts(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkMovesOutlastTimeouts"},
		{"two keys, and two users, whose 32-bit hashtext() collide are different",
			func(r tester) { checkHashCollisions(r, t.env.Meta, t.env.DB, rs) }, Base, "checkHashCollisions"},
		{"the moment expires_at passes, the expiry job moves the reservation and ConfirmBeforeExpiry refuses it",
			func(r tester) { checkJustPast(r, t.env.Meta, t.env.DB, rs) }, Base, "checkJustPast"},
		{"with the database's clock 5 s ahead of the application's, a HELD answer carries the expires_at Lookup reads, and ConfirmBeforeExpiry and the expiry job (plain, and held open) judge expires_at by the clock that stamped it (in a request, and in an attempt held open): at 1.5 times a TTL, a reservation of that TTL is refused and expired, one of three times it is confirmed or left HELD",
			func(r tester) { checkClockAhead(r, t.env.Meta, rs) }, Base, "checkClockAhead"},
		{"the first Opens on an empty database, six at once, all open; an Attach to an empty database is refused",
			func(r tester) { checkConcurrentFirstOpens(r, t.env.Meta, t.env.Admin, rs) }, Base, "checkConcurrentFirstOpens"},
		{"one ExpireDue moves every due reservation, 6,000 of them at once over 350 SKUs; where survives-restart is claimed, node 0 restarted with all 1,004 units of a SKU reserved sells none of them again",
			func(r tester) { checkExpireAllDue(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkExpireAllDue"},
		{"requests at once for the last unit of a SKU counted in a node's memory get it once: one that dies mid-reserve per processor, until 2,000 SKUs were raced for within 500 ns (or half a quick call, where a call takes a round trip), and 32 whole ones, for each of 300",
			func(r tester) { checkLastUnitRace(r, t.env.Meta, t.env.DB, rs) }, strategy.NoOversell, "checkLastUnitRace"},
		// Last: the sequences stay where it moved them.
		{"on tables whose ids have passed the 4-byte bound (every sequence moved there, as a long-lived table would be), a SKU sells out, refuses what it must, and its transitions move and give back",
			func(r tester) { checkIdsPastInt4(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, Base, "checkIdsPastInt4"},
	}
	// Only for a strategy that claims it: one that does not waits here by
	// design, as the phantom scenario shows.
	if t.env.Meta.Claims.Has(strategy.NoWait) {
		parts = append(parts, part{"a request with a new key and user does not wait while another transaction holds every row of the strategy's tables as an UPDATE in flight would",
			func(r tester) { checkNoWaitBehindLockedRows(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoWait, "checkNoWaitBehindLockedRows"},
			part{"16 callers' requests of new keys and users for one SKU with a unit for each never wait for one another (pg_blocking_pids of every backend, read until the last answer)",
				func(r tester) { checkNoWaitUnderLoad(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoWait, "checkNoWaitUnderLoad"},
			part{"a request whose key differs only in case from the key of an attempt held open that took the SKU's last unit does not wait for that attempt",
				func(r tester) { checkNoWaitBesideCaseTwin(r, t.env.Meta, t.env.DB, t.env.Admin, rs) }, strategy.NoWait, "checkNoWaitBesideCaseTwin"})
	}
	// After every other: their calls have been through the pool.
	parts = append(parts, part{"the strategy leaves the pool's connections as it found them: no session setting left by a SET without LOCAL",
		func(r tester) { checkSessionsUntouched(r, t.env.DB) }, Base, "checkSessionsUntouched"})
	parts, err := onlyChecks(parts, t.env.Checks, func(p part) string { return p.name })
	if err != nil {
		return err
	}
	for i, p := range parts {
		began := time.Now()
		r := runRecorded(p.run)
		if err := t.checkLeftOpen(ctx, p.name); err != nil {
			return err
		}
		// Where a cell's time goes (compare/last-run.json): most of it is
		// waits the checks impose (lock holds, timeouts), not work. A
		// check's later parts only judge what its first part did.
		if i == 0 || parts[i-1].name != p.name {
			t.vary("ms in "+p.name, int(time.Since(began).Milliseconds()))
		}
		if r.skipped != "" {
			t.fact("not applicable", "%s", r.skipped)
			continue
		}
		for _, l := range r.logs {
			t.fact("note", "%s", l)
		}
		t.checkNamed(p.name, p.claim, p.what, len(r.errs) == 0, fmt.Sprintf("%d failed: %s", len(r.errs), strings.Join(r.errs, "; ")), noRequest)
		if t.violated(t.env.StopOnViolation) {
			break
		}
	}
	if err := t.checkLeftOpen(ctx, "the last check"); err != nil {
		return err
	}
	return ctx.Err()
}

// recorder is a tester that keeps what a check reports. Fatalf and Skip
// end the check (a panic runRecorded recovers), as they end a test.
type recorder struct {
	errs, logs []string
	skipped    string
}

type recorderStop struct{}

func runRecorded(f func(tester)) (r *recorder) {
	r = &recorder{}
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(recorderStop); !ok {
				r.errs = append(r.errs, fmt.Sprintf("panic: %v", p))
			}
		}
	}()
	f(r)
	return r
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(recorderStop{})
}
func (r *recorder) Fatal(args ...any) {
	r.errs = append(r.errs, fmt.Sprint(args...))
	panic(recorderStop{})
}
func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	panic(recorderStop{})
}

// onlyChecks returns the parts named in names, in that order (a name's
// parts in theirs); none named, all of them. A name that is no part's is
// an ErrUnknownCheck.
func onlyChecks[P any](parts []P, names []string, name func(P) string) ([]P, error) {
	if len(names) == 0 {
		return parts, nil
	}
	var out []P
	for i, n := range names {
		if slices.Contains(names[:i], n) {
			continue
		}
		if n == checkLeftOpenName {
			continue // not a part: it runs after each
		}
		found := false
		for _, p := range parts {
			if name(p) == n {
				found = true
				out = append(out, p)
			}
		}
		if !found {
			return nil, fmt.Errorf("%w: %q is no check of %s", ErrUnknownCheck, n, KindDeploymentContract)
		}
	}
	return out, nil
}
