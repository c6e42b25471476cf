// Package controls holds the negative controls of table 28-1: copies of
// strategy A (hotrow) with one deliberate mistake each, claiming the
// guarantee the mistake breaks, redislock without its conditional UPDATE
// (ctl-lock-only) or with one mistake in its lock's use (lockonly.go),
// rediscounter with one mistake in its give-back (rediscounter.go),
// combine with one in how it forms a batch (combine.go), and
// (memquota.go) strategy C claiming what its in-memory
// counters cannot keep across a node process's restart. The harness must
// catch each with the claim
// and scenario listed; package compare runs them next to the registered
// strategies and fails when one escapes. They are never registered with
// strategy.Register, so they never appear among the strategies; helper
// processes find them through strategytest.RegisterForHelpers.
//
// What decides a write must be a condition the database evaluates at the
// moment of writing (a WHERE clause, a unique index, a CHECK). Each control
// moves one such condition somewhere else: it is missing, in another
// transaction, evaluated before the write, or counted from what was read
// instead of from what was written.
package controls

import (
	"slices"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// Control is one negative control and the violations it must produce.
type Control struct {
	Meta   strategy.Meta
	Case   string // the seed's case it reproduces, e.g. "C28-10", or "new"
	Breaks string // what is broken, in one line
	Expect []Expectation
	// Race says the mistake shows only when requests interleave in a
	// certain way: its detection rate is measured (see detection_test.go
	// in package compare).
	Race bool
	// Admission, when set, is the broken admission the http-* scenarios
	// must put in front of the control (strategytest.Env.Admission).
	Admission func(inner strategy.Strategy, l admission.Limits) (service.Admission, error)
}

// Expectation is a violation a control must produce: a claim, flagged in a
// scenario.
type Expectation struct {
	Scenario string
	Claim    strategy.Claims
	// Check, when set, is the check of the deployment contract that must
	// fail (strategytest.Check.Name).
	Check string
	// Runs are the deployment contract's checks the scenario runs for the
	// expectation, in order (strategytest.Env.Checks); nil is Check alone,
	// or, without a Check, every check.
	Runs []string
}

// Scenarios lists the scenarios the control's expectations name, each once,
// in order: all that need to run to judge it.
func (c Control) Scenarios() []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range c.Expect {
		if !seen[e.Scenario] {
			seen[e.Scenario] = true
			out = append(out, e.Scenario)
		}
	}
	return out
}

// Checks lists the deployment contract's checks the control's
// expectations run in a scenario, each once, in order
// (strategytest.Env.Checks); nil, every check.
func (c Control) Checks(scenario string) []string {
	var out []string
	for _, e := range c.Expect {
		runs := e.Runs
		if runs == nil && e.Check != "" {
			runs = []string{e.Check}
		}
		if e.Scenario != scenario {
			continue
		}
		if runs == nil {
			return nil // one expectation wants them all
		}
		for _, r := range runs {
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	return out
}

// contract marks an expectation on a check of the contract itself, which
// every strategy must pass whatever it claims (strategytest.Base).
const contract = strategytest.Base

// claimsOfA is what strategy A claims, and so what its copies claim.
const claimsOfA = strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser | strategy.ReturnOnce |
	strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart

type spec struct {
	name, cs, breaks string
	b                breakage
	claims           strategy.Claims
	race             bool
	reserveOnly      bool // nodes with Reserve and Lookup only (reserveonly.go)
	expect           []Expectation
	admission        func(inner strategy.Strategy, l admission.Limits) (service.Admission, error)
}

// fromStrategy makes a control of a registered strategy's Meta built with
// one mistake (or with a claim it cannot keep): renamed, described as a
// control, and judged on exp.
func fromStrategy(m strategy.Meta, name, description, cs, breaks string, exp []Expectation) Control {
	m.Name = name
	m.Description = "negative control: " + description
	m.Correctness = "none: it claims what it cannot keep"
	return Control{Meta: m, Case: cs, Breaks: breaks, Expect: exp}
}

func expect(scenario string, claims ...strategy.Claims) []Expectation {
	var out []Expectation
	for _, c := range claims {
		out = append(out, Expectation{Scenario: scenario, Claim: c})
	}
	return out
}

func join(lists ...[]Expectation) []Expectation {
	var out []Expectation
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

var specs = []spec{
	{name: "ctl-release-no-status-check", cs: "C28-10", b: releaseWithoutStatusCheck, claims: claimsOfA,
		breaks: "the expiry job reads due ids without status = 'HELD' and returns one unit per id read",
		expect: join(expect("expiry-replay", strategy.ReturnOnce, strategy.Conserves), expect("replay-then-sell", strategy.NoOversell, strategy.Conserves))},
	{name: "ctl-split-release", cs: "C28-11", b: splitRelease, claims: claimsOfA,
		breaks: "the expiry job returns stock in one transaction and moves status in another; it dies between them and is rerun",
		expect: join(expect("expiry-replay", strategy.ReturnOnce), expect("kill-release", strategy.ReturnOnce, strategy.NoOversell))},
	{name: "ctl-check-then-insert", cs: "C28-12", b: checkThenInsert, claims: claimsOfA,
		breaks: "the one-per-user rule is a SELECT before the INSERT, without the partial unique index",
		expect: join(expect("same-user", strategy.OneActivePerUser), expect("user-limit", strategy.OneActivePerUser))},
	{name: "ctl-unconditional-decrement", cs: "C28-13", b: unconditionalDecrement, claims: claimsOfA,
		breaks: "the decrement has no available > 0 (and the table no CHECK to stop it)",
		expect: join(expect("sell-out", strategy.NoOversell), expect("contention", strategy.NoOversell), expect("storm", strategy.NoOversell))},
	{name: "ctl-lost-update", cs: "C28-13", b: lostUpdate, claims: claimsOfA, race: true,
		breaks: "reads available, decides in the client, writes available = the value read - 1",
		expect: expect("contention", strategy.NoOversell)},
	{name: "ctl-expire-confirmed", cs: "C28-08", b: expireConfirmed, claims: claimsOfA,
		breaks: "the expiry job also moves due CONFIRMED rows to EXPIRED and returns their units",
		expect: expect("confirm-vs-expire", strategy.ReturnOnce)},
	{name: "ctl-expire-counts-read", cs: "C28-07", b: expireCountsRead, claims: claimsOfA, race: true,
		breaks: "the expiry job reads the due HELD ids, moves them with status = 'HELD', but returns one unit per id read",
		expect: expect("expiry-race", strategy.ReturnOnce)},
	{name: "ctl-expire-by-ids-read", cs: "C28-08", b: expireByIDsRead, claims: claimsOfA,
		breaks: "the expiry job reads the due HELD ids, then moves them by id alone (\"they were HELD when read\"), without a lock or status = 'HELD': a late payment that held the row while the job read commits CONFIRMED, and the job, waiting for the row, expires it and gives its unit back",
		expect: inContract(contract, "checkJobBehindTransition")},
	{name: "ctl-key-not-unique", cs: "C28-04", b: keyNotUnique, claims: claimsOfA, race: true,
		breaks: "no unique index on request_key: a SELECT by key decides REPLAY before the INSERT",
		expect: expect("duplicate-key", strategy.IdempotentKey)},
	{name: "ctl-unique-violation-is-limit", cs: "C28-04", b: uniqueViolationIsLimit, claims: claimsOfA, race: true,
		breaks: "every unique violation is answered USER_LIMIT, also a replay that reached the per-user index first (the seed's intermittent bug)",
		expect: expect("duplicate-key", strategy.IdempotentKey)},
	{name: "ctl-release-no-status", cs: "C28-07", b: releaseNoStatusCheck, claims: claimsOfA,
		breaks: "Release moves the row without status = 'HELD' and returns a unit on every call",
		expect: expect("release-replay", strategy.ReturnOnce)},
	{name: "ctl-release-read-then-move", cs: "C28-08", b: releaseReadThenMove, claims: claimsOfA, race: true,
		breaks: "Release reads the row, and if it was HELD moves it with status <> 'RELEASED': a second Release is stopped, a Confirm committed in between is overwritten and its unit given back",
		expect: expect("release-vs-confirm", strategy.ReturnOnce)},
	{name: "ctl-release-refuses-due", cs: "C28-08", b: releaseRefusesDue, claims: claimsOfA,
		breaks: "Release moves only rows whose expires_at has not passed: a due hold its client gives back stays HELD, to be confirmed by a late payment, its unit back only when the expiry job runs",
		expect: inContract(contract, "checkDueReleases")},
	{name: "ctl-replay-folds-confirmed", cs: "C28-04", b: replayFoldsConfirmed, claims: claimsOfA,
		breaks: "the reserve path reads a known key's CONFIRMED row as HELD: a paid reservation's request sent again is a REPLAY that says HELD",
		expect: expect("release-replay", strategy.IdempotentKey)},
	{name: "ctl-confirm-no-status", cs: "C28-08", b: confirmNoStatusCheck, claims: claimsOfA,
		breaks: "Confirm moves the row to CONFIRMED without status = 'HELD', also after release or expiry",
		expect: expect("release-replay", strategy.ReturnOnce)},
	{name: "ctl-confirm-late", cs: "C28-08", b: confirmIgnoresExpiry, claims: claimsOfA,
		breaks: "Confirm in its default mode (before expiry) does not look at expires_at: a late payment confirms a due reservation",
		expect: expect("confirm-vs-expire", contract)},
	{name: "ctl-release-keeps-unit", cs: "new", b: releaseKeepsUnit, claims: claimsOfA,
		breaks: "Release moves the row to RELEASED but never gives the unit back",
		expect: expect("release-replay", strategy.Conserves)},
	{name: "ctl-sold-out-when-locked", cs: "C28-14", b: soldOutWhenLocked, claims: claimsOfA,
		breaks: "takes the stock row with FOR NO KEY UPDATE NOWAIT and answers SOLD_OUT when it is locked",
		expect: expect("phantom", strategy.NoPhantomSoldOut)},
	{name: "ctl-claims-no-wait", cs: "C28-14", b: correct, claims: claimsOfA&^strategy.NoPhantomSoldOut | strategy.NoWait,
		breaks: "strategy A unchanged, but claiming no-wait: its decrement holds the stock row until commit",
		expect: expect("phantom", strategy.NoWait)},
	{name: "ctl-claims-no-wait-reserve-only", cs: "C28-14", b: correct, claims: claimsOfA&^strategy.NoPhantomSoldOut | strategy.NoWait, reserveOnly: true,
		breaks: "strategy A with Reserve and Lookup only (no sessions for the phantom scenario to hold), claiming no-wait: its decrement holds the stock row until commit",
		expect: inContract(strategy.NoWait, "checkNoWaitBehindLockedRows")},
	{name: "ctl-unbounded-gate", cs: "C28-05", b: correct, claims: claimsOfA, admission: newUnboundedGate,
		breaks: "strategy A unchanged, behind an HTTP front whose admission admits every request at once",
		expect: join(expect("http-admission", contract), expect("http-overload", contract))},
	{name: "ctl-restart-from-config", cs: "C28-15", b: restartFromConfig, claims: claimsOfA,
		breaks: "a restart sets available = total again, as a restart from config would",
		expect: expect("restart", strategy.SurvivesRestart)},
	{name: "ctl-grants-all", cs: "seed 004", b: grantsAll, claims: claimsOfA | strategy.LeastPrivilege,
		breaks: "Meta.Setup grants the runtime role ALL on its tables, TRUNCATE and DELETE among them",
		expect: expect("least-privilege", strategy.LeastPrivilege)},
	{name: "ctl-grant-option", cs: "seed 004", b: grantOption, claims: claimsOfA | strategy.LeastPrivilege,
		breaks: "Meta.Setup grants the runtime role strategy A's privileges WITH GRANT OPTION (\"the deploy step, run as the service's role, grants reporting its read access\"): a taken-over runtime role hands INSERT and UPDATE to anyone",
		expect: expect("least-privilege", strategy.LeastPrivilege)},
	{name: "ctl-grants-sequence-all", cs: "seed 004", b: grantsSequenceAll, claims: claimsOfA | strategy.LeastPrivilege,
		breaks: "Meta.Setup grants the runtime role ALL on the reservation ids' sequence (\"an operator can setval after a restore\"), where nextval needs USAGE: it may rewind the ids",
		expect: expect("least-privilege", strategy.LeastPrivilege)},
	{name: "ctl-grants-total", cs: "seed 004", b: grantsTotal, claims: claimsOfA | strategy.LeastPrivilege,
		breaks: "Meta.Setup grants the runtime role UPDATE of the stock's total beside available (\"a restock endpoint is on the roadmap\"): a taken-over runtime role raises a SKU's total and sells units that do not exist",
		expect: expect("least-privilege", strategy.LeastPrivilege)},
	{name: "ctl-definer-restock", cs: "seed 004", b: definerRestock, claims: claimsOfA | strategy.LeastPrivilege,
		breaks: "Meta.Setup also creates a SECURITY DEFINER restock function for an operator's console (\"the console calls it as the service\") and never revokes EXECUTE from PUBLIC: any role, the runtime role taken over among them, raises a SKU's total through it",
		expect: expect("least-privilege", strategy.LeastPrivilege)},
	{name: "ctl-error-is-sold-out", cs: "new", b: errorIsSoldOut, claims: claimsOfA,
		breaks: "a reservation whose transaction fails with an error, a connection lost at COMMIT among them, is answered SOLD_OUT",
		expect: expect("partition", contract)},
	{name: "ctl-resend-after-error-sold-out", cs: "new", b: resendAfterErrorSoldOut, claims: claimsOfA,
		breaks: "a request whose attempt failed with an error, sent again and finding no row, is answered SOLD_OUT although units remain",
		expect: expect("partition", contract)},
	{name: "ctl-resend-unsure-then-replay", cs: "new", b: resendUnsureThenReplay, claims: claimsOfA,
		breaks: "a request whose attempt failed with an error, sent again, fails once more, then is answered REPLAY though no row was ever written: the resend check accepts REPLAY after an unknown resend, and the acknowledged-but-absent check must catch it",
		expect: expect("partition", contract)},
	{name: "ctl-async-commit", cs: "new", b: asyncCommit, claims: claimsOfA,
		breaks: "reservations commit with synchronous_commit = off: acknowledged before the standby has them",
		expect: expect("failover-sync", contract)},
	{name: "ctl-claims-failover", cs: "new", b: correct, claims: claimsOfA | strategy.SurvivesFailover,
		breaks: "strategy A unchanged, but claiming survives-failover: it commits on the primary alone",
		expect: expect("failover-async", strategy.SurvivesFailover)},
	{name: "ctl-replay-is-held", cs: "C28-04", b: replayIsHeld, claims: claimsOfA,
		breaks: "a known key of the same user and SKU is answered HELD again, not REPLAY",
		expect: expect("partition", contract)},
	{name: "ctl-ttl-wrong-unit", cs: "new", b: ttlWrongUnit, claims: claimsOfA,
		breaks: "the TTL is sent in milliseconds and read as seconds: every reservation is held 1000 times as long",
		expect: expect("sell-out", contract)},
	{name: "ctl-limit-per-user", cs: "C28-04", b: limitPerUser, claims: claimsOfA,
		breaks: "the one-active index is on user_id alone: a user who holds one SKU is refused every other",
		expect: expect("user-limit", contract)},
	{name: "ctl-limit-counts-ended", cs: "C28-07", b: limitCountsEnded, claims: claimsOfA,
		breaks: "the one-active index counts every status: a released or expired reservation still refuses its user the SKU",
		expect: join(expect("release-replay", contract), expect("expiry-replay", contract))},
	{name: "ctl-limit-held-only", cs: "C28-07", b: limitHeldOnly, claims: claimsOfA,
		breaks: "the one-active index counts only HELD: a user whose reservation was confirmed may reserve the SKU again",
		expect: expect("release-replay", strategy.OneActivePerUser)},
	{name: "ctl-release-confirmed", cs: "C28-08", b: releaseConfirmed, claims: claimsOfA,
		breaks: "Release moves CONFIRMED rows too: a late cancel gives back a unit that was paid for",
		expect: expect("release-replay", strategy.ReturnOnce)},
	{name: "ctl-release-expired", cs: "C28-10", b: releaseExpired, claims: claimsOfA,
		breaks: "Release moves EXPIRED rows too: a cancel after the expiry job gives the unit back a second time",
		expect: expect("replay-then-sell", strategy.ReturnOnce)},
	{name: "ctl-open-reloads-stock", cs: "new", b: openReloadsStock, claims: claimsOfA,
		breaks: "Open loads stock with ON CONFLICT DO UPDATE: opening a SKU again resets its stock instead of failing",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-expire-every-sku", cs: "new", b: expireEverySKU, claims: claimsOfA,
		breaks: "the expiry job has no sku = ANY(...): it expires the due reservations of every deployment in the database",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-expire-held-open-every-sku", cs: "new", b: expireHeldOpenEverySKU, claims: claimsOfA,
		breaks: "the expiry job held open (a maintenance sweep in one transaction) has no sku = ANY(...): it expires the due reservations of every deployment in the database; the plain job keeps to its own",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-expire-early", cs: "new", b: expireEarly, claims: claimsOfA,
		breaks: "the expiry job compares expires_at with now() + 2 s: a reservation can expire two seconds before its time",
		expect: inContract(contract, "checkExpiryTiming")},
	{name: "ctl-expire-by-app-clock", cs: "new", b: expireByAppClock, claims: claimsOfA,
		breaks: "the expiry job compares expires_at, stamped by the database's clock, with the application's (time.Now() as a parameter): where the two clocks differ, a reservation expires late or early",
		expect: inContract(contract, "checkClockAhead")},
	{name: "ctl-answer-expires-by-app-clock", cs: "new", b: answerExpiresByAppClock, claims: claimsOfA,
		breaks: "a HELD answer's expires_at is the application's clock plus the TTL, the row's the database's now() plus the TTL: where the two clocks differ, the client is told another deadline than the one the expiry job keeps",
		expect: inContract(contract, "checkClockAhead")},
	{name: "ctl-confirm-by-app-clock", cs: "new", b: confirmByAppClock, claims: claimsOfA,
		breaks: "ConfirmBeforeExpiry compares expires_at, stamped by the database's clock, with the application's: where the two clocks differ, a payment is refused early or accepted late",
		expect: inContract(contract, "checkClockAhead")},
	{name: "ctl-make-due-near", cs: "new", b: makeDueNear, claims: claimsOfA,
		breaks: "MakeDue moves expires_at 400 seconds back, not the 400 days strategy.Ager asks for: its rows are due, but inside the window a job that looks back only over the last hours still sees (outsider round 33's m9)",
		expect: inContract(contract, "checkMakeDueFarBack")},
	{name: "ctl-confirm-early", cs: "C28-08", b: confirmEarly, claims: claimsOfA,
		breaks: "ConfirmBeforeExpiry compares expires_at with now() + 2 s: a payment in a reservation's last two seconds is refused",
		expect: inContract(contract, "checkConfirmTiming")},
	{name: "ctl-stock-off-by-one", cs: "new", b: stockOffByOne, claims: claimsOfA,
		breaks: "Open loads a stock of n as n + 1 units, in total and available alike: the audit reads the same row and agrees",
		expect: join(expect("sell-out", strategy.NoOversell), inContract(contract, "checkConfig"))},
	{name: "ctl-release-every-sku", cs: "new", b: releaseEverySKU, claims: claimsOfA,
		breaks: "Release gives the unit back to every SKU of the deployment (sku = ANY of its SKUs), not to the released row's",
		expect: inContract(contract, "checkUnitsPerSKU")},
	{name: "ctl-key-column-narrow", cs: "new", b: keyColumnNarrow, claims: claimsOfA,
		breaks: "request_key is varchar(64): a valid key of 65 to 128 bytes fails to insert",
		expect: inContract(contract, "checkOddText")},
	{name: "ctl-ttl-whole-seconds", cs: "new", b: ttlWholeSeconds, claims: claimsOfA,
		breaks: "the TTL is sent as whole seconds, truncated: a TTL under a second expires at once, every other loses its fraction",
		expect: inContract(contract, "checkTTLMicroseconds")},
	{name: "ctl-confirm-again", cs: "C28-08", b: confirmAgain, claims: claimsOfA,
		breaks: "Confirm moves HELD or CONFIRMED rows: a payment callback delivered twice reports moving the row twice",
		expect: inContract(contract, "checkUnitsPerSKU")},
	{name: "ctl-sold-out-first", cs: "C28-04", b: soldOutFirst, claims: claimsOfA,
		breaks: "remembers the SKUs it answered SOLD_OUT and answers SOLD_OUT at once, before it looks at the key: a resent key is SOLD_OUT, not REPLAY",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-replay-extends-hold", cs: "C28-04", b: replayExtendsHold, claims: claimsOfA,
		breaks: "a request sent again for a HELD reservation moves its expires_at to the new TTL from now: resending keeps the unit indefinitely",
		expect: inContract(contract, "checkAnswersWhenSoldOut")},
	{name: "ctl-key-unique-per-sku", cs: "C28-04", b: keyPerSKU, claims: claimsOfA,
		breaks: "the key is unique per SKU (sku, request_key), looked up by key first: one key sent at once for two SKUs is HELD twice",
		expect: expect("duplicate-key", strategy.IdempotentKey)},
	{name: "ctl-key-case-folded", cs: "new", b: keyCaseFolded, claims: claimsOfA,
		breaks: "keys are compared without case (a unique index and the lookup on lower(request_key)): order-1 is answered as Order-1",
		expect: inContract(contract, "checkDistinctText")},
	{name: "ctl-ttl-capped", cs: "new", b: ttlCapped, claims: claimsOfA,
		breaks: "a TTL over an hour is cut to an hour",
		expect: inContract(contract, "checkExpiryTiming")},
	{name: "ctl-lock-timeout-sold-out", cs: "C28-14", b: lockTimeoutSoldOut, claims: claimsOfA,
		breaks: "reserves with lock_timeout 500 ms and answers a lock not granted in time SOLD_OUT",
		expect: expect("contention", strategy.NoPhantomSoldOut)},
	{name: "ctl-lock-timeout-long-sold-out", cs: "C28-14", b: lockTimeoutLongSoldOut, claims: claimsOfA,
		breaks: "reserves with lock_timeout 15 s and answers a lock not granted in time SOLD_OUT",
		expect: inContract(strategy.NoPhantomSoldOut, "checkWaitOutlastsTimeouts")},
	{name: "ctl-deadline-sold-out", cs: "C28-14", b: deadlineSoldOut, claims: claimsOfA,
		breaks: "reserves under a 3 s deadline of its own and answers SOLD_OUT when it meets it while its caller still waits",
		expect: inContract(strategy.NoPhantomSoldOut, "checkWaitOutlastsTimeouts")},
	{name: "ctl-expire-lag", cs: "new", b: expireLag, claims: claimsOfA,
		breaks: "the expiry job moves a reservation only half a second after its expires_at (\"clock-skew tolerance\")",
		expect: inContract(contract, "checkJustPast")},
	{name: "ctl-confirm-grace", cs: "C28-08", b: confirmGrace, claims: claimsOfA,
		breaks: "ConfirmBeforeExpiry accepts a payment up to half a second after expires_at",
		expect: inContract(contract, "checkJustPast")},
	{name: "ctl-limit-before-key", cs: "C28-04", b: limitBeforeKey, claims: claimsOfA,
		breaks: "looks for the user's other reservation of the SKU before the key: a known key from a user who holds the SKU under another key is USER_LIMIT, not KEY_REUSED",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-ended-key-replays", cs: "C28-04", b: endedKeyReplays, claims: claimsOfA,
		breaks: "a key whose reservation was released or expired is answered REPLAY whoever sends it: another user learns a reservation that is not theirs, instead of KEY_REUSED",
		expect: join(expect("release-replay", strategy.IdempotentKey), expect("expiry-replay", strategy.IdempotentKey))},
	{name: "ctl-lookup-own-skus", cs: "new", b: lookupOwnSKUs, claims: claimsOfA,
		breaks: "Lookup finds only keys of the deployment's own SKUs: a key another deployment in the same database made reads NOT_FOUND",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-replay-own-skus", cs: "C28-04", b: replayOwnSKUs, claims: claimsOfA,
		breaks: "the reserve path looks a known key up among the deployment's own SKUs: another deployment's key, sent here by another user, finds no owner, meets the unique index and is answered USER_LIMIT instead of KEY_REUSED",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-known-key-first", cs: "new", b: knownKeyFirst, claims: claimsOfA,
		breaks: "a known key is answered (REPLAY or KEY_REUSED) before the SKU is checked: a request for an unknown SKU, or another deployment's, with a key already used is not BAD_REQUEST",
		expect: join(expect("bad-input", contract), inContract(contract, "checkConfig"))},
	{name: "ctl-open-partial", cs: "new", b: openPartial, claims: claimsOfA,
		breaks: "Open loads each SKU in a transaction of its own and reports ErrStockExists for those that had stock: a new SKU listed with an existing one is loaded by the refused Open, and can never be opened",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-replay-due-expired", cs: "C28-08", b: replayDueExpired, claims: claimsOfA,
		breaks: "a request sent again while its reservation is due and unmoved is answered REPLAY with status EXPIRED, though the row is HELD, holds its unit, counts against its user and takes the late payment",
		expect: inContract(contract, "checkDueHoldsItsUnit")},
	{name: "ctl-expire-window", cs: "C28-10", b: expireWindow, claims: claimsOfA,
		breaks: "the expiry job moves only reservations that fell due within the last 6 hours (a bounded scan): one overdue for longer, as after the job was down, holds its unit for ever",
		expect: inContract(contract, "checkUnitsPerSKU")},
	{name: "ctl-late-confirm-window", cs: "C28-08", b: lateConfirmWindow, claims: claimsOfA,
		breaks: "ConfirmUntilExpired accepts a late payment only up to 10 minutes after expires_at, though no expiry moved the reservation",
		expect: inContract(contract, "checkDueHoldsItsUnit")},
	{name: "ctl-close-releases", cs: "new", b: closeReleases, claims: claimsOfA,
		breaks: "Close releases the HELD reservations of the deployment's SKUs (\"graceful shutdown\"): a customer paying for a hold finds it RELEASED, and its unit sold to another, while the service's other processes keep serving",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-key-storable-nul-only", cs: "new", b: storableNULOnly, claims: claimsOfA,
		breaks: "Lookup, Confirm and Release screen out keys with a NUL byte but not keys that are not UTF-8: such a key reaches PostgreSQL, and the call fails (22021) where the contract answers NOT_FOUND, false or 0",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-confirm-skip-locked", cs: "C28-08", b: confirmSkipLocked, claims: claimsOfA,
		breaks: "Confirm locks the reservation's row with SKIP LOCKED: a payment that arrives while another transaction holds the row (an expiry job held open that then rolls back, an UPDATE in flight) is refused though nobody moved the reservation",
		expect: inContract(contract, "checkTransitionsWaitForLockedRows")},
	{name: "ctl-sold-out-per-process", cs: "C28-14", b: soldOutPerProcess, claims: claimsOfA,
		breaks: "a process remembers the SKUs it found sold out and, after the key and the user, answers SOLD_OUT from that memory until its own Release or ExpireDue gives a unit back: a unit released through another process of the service (Attach) is never sold by this one",
		expect: inContract(contract, "checkAnswersWhenSoldOut")},
	{name: "ctl-schema-without-lock", cs: "new", b: schemaWithoutLock, claims: claimsOfA,
		breaks: "Open creates the schema without a lock, trusting IF NOT EXISTS: first Opens at once on an empty database, as a service's processes starting together make them, fail on the catalog's unique indexes",
		expect: inContract(contract, "checkConcurrentFirstOpens")},
	{name: "ctl-limit-by-concat", cs: "C28-04", b: limitByConcat, claims: claimsOfA,
		breaks: "the one-active-per-user index is on sku || ':' || user_id: user \"vip:u\" asking for SKU \"S\" is refused because user \"u\" holds SKU \"S:vip\"",
		expect: inContract(contract, "checkJoinedText")},
	{name: "ctl-key-prefix-64", cs: "C28-04", b: keyPrefix64, claims: claimsOfA,
		breaks: "keys are unique, and looked up, on their first 64 characters (a prefix index): a long key is answered with another long key's reservation",
		expect: inContract(contract, "checkJoinedText")},
	{name: "ctl-skus-as-csv", cs: "new", b: skusAsCSV, claims: claimsOfA,
		breaks: "Release passes the deployment's SKUs to SQL as one comma-separated text: the reservation of a SKU with a comma in its name is never released",
		expect: inContract(contract, "checkJoinedText")},
	{name: "ctl-expire-retry-counts", cs: "C28-10", b: expireRetryCounts, claims: claimsOfA,
		breaks: "the expiry job runs at SERIALIZABLE in two statements and retries after 40001, keeping its count across tries: a job refused once, behind an attempt that committed a change to the stock row, reports the first try's units too",
		expect: inContract(contract, "checkTransitionsBehindAttempt")},
	{name: "ctl-attach-recounts", cs: "C28-15", b: attachRecounts, claims: claimsOfA,
		breaks: "Attach sets each stock row's available to total minus the active rows it counted first: behind an attempt in flight it writes a count from before that attempt commits, and the unit is sold twice",
		expect: inContract(strategy.NoOversell, "checkAttachBesideAttempt")},
	{name: "ctl-ttl-justified", cs: "new", b: ttlJustified, claims: claimsOfA,
		breaks: "expires_at is now() + justify_hours(ttl): a TTL of 24 hours becomes one calendar day, 23 or 25 hours long where the session's time zone changes to or from daylight saving time",
		expect: inContract(contract, "checkTTLAcrossDST")},
	{name: "ctl-key-by-hash", cs: "C28-04", b: keyByHash, claims: claimsOfA,
		breaks: "a key is looked up by hashtext(request_key), as through a hash or a 32-bit key column: a key whose hash equals another key's reads that key's reservation (one pair in tens of thousands of keys)",
		expect: inContract(contract, "checkHashCollisions")},
	{name: "ctl-limit-skips-due", cs: "C28-08", b: limitSkipsDue, claims: claimsOfA,
		breaks: "the per-user limit, a SELECT serialised per SKU by the stock row's lock with no unique index behind it, skips HELD reservations past their expires_at: the user of a due reservation no job has moved gets a second one, and the late payment leaves both active",
		expect: inContract(contract, "checkDueHoldsItsUnit")},
	{name: "ctl-confirm-cart", cs: "C28-08", b: confirmCart, claims: claimsOfA,
		breaks: "Confirm confirms every HELD reservation of the key's user in the deployment (\"pay for the cart\"): a reservation of another SKU nobody paid for becomes CONFIRMED",
		expect: inContract(contract, "checkTransitionMovesOneKey")},
	{name: "ctl-limit-cache-node", cs: "new", b: limitCacheNode, claims: claimsOfA,
		breaks: "each node remembers which users it sold a SKU to and answers USER_LIMIT from memory, forgetting a user only when a Release reaches that node: released through another node, the user is refused where the reservation was made",
		expect: expect("release-replay", contract)},
	{name: "ctl-lookup-caches-own", cs: "new", b: lookupCachesOwn, claims: claimsOfA,
		breaks: "each node answers Lookup from the reservations it made itself and forgets one only when it moves it: a reservation another node released or confirmed still reads HELD there",
		expect: expect("release-replay", contract)},
	{name: "ctl-lookup-ignores-closed", cs: "C28-15", b: lookupIgnoresClosed, claims: claimsOfA,
		breaks: "Lookup on a node that was restarted, or whose deployment was closed, still answers instead of ErrNodeClosed",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-session-any-sku", cs: "new", b: sessionAnySKU, claims: claimsOfA,
		breaks: "Session.Reserve checks the request's fields but not that its SKU is the deployment's: it sells another deployment's units",
		expect: inContract(contract, "checkSession")},
	{name: "ctl-lazy-expiry-count", cs: "C28-08", b: lazyExpiryCount, claims: claimsOfA,
		breaks: "counts a HELD reservation past its expires_at as a free unit without moving it: its late payment confirms a unit sold again",
		expect: inContract(contract, "checkDueHoldsItsUnit")},
	{name: "ctl-expire-in-batches", cs: "C28-10", b: expireInBatches, claims: claimsOfA,
		breaks: "ExpireDue moves at most 1,000 due reservations a call and returns",
		expect: inContract(contract, "checkExpireAllDue")},
	{name: "ctl-expires-without-zone", cs: "new", b: expiresWithoutZone, claims: claimsOfA,
		breaks: "expires_at is a timestamp without time zone: right on a server in UTC, hours off in any other zone",
		expect: inContract(contract, "checkExpiryTiming")},
	{name: "ctl-key-trimmed", cs: "C28-04", b: keyTrimmed, claims: claimsOfA,
		breaks: "keys are looked up with their spaces trimmed (\"proxies pad Idempotency-Key headers\"): a key never reserved, K with a space before it, reads K's reservation",
		expect: inContract(contract, "checkDistinctText")},
	{name: "ctl-key-folded", cs: "C28-04", b: keyFolded, claims: claimsOfA,
		breaks: "keys are looked up in Unicode compatibility form, NFKC (\"the IME types order numbers full-width\"): a key never reserved, K in full-width forms, reads K's reservation",
		expect: inContract(contract, "checkDistinctText")},
	{name: "ctl-key-dash-folded", cs: "C28-04", b: keyDashFolded, claims: claimsOfA,
		breaks: "keys are looked up with Unicode dashes read as '-' and characters of no width dropped (\"order numbers pasted from PDFs and e-mails\"): a key never reserved, K with an en dash, reads K's reservation",
		expect: inContract(contract, "checkDistinctText")},
	{name: "ctl-key-uuid-folded", cs: "C28-04", b: keyUUIDFolded, claims: claimsOfA,
		breaks: "a UUID-shaped key is looked up in canonical form, lower case without braces, URN or hyphens (\"RFC 4122: UUIDs are case-insensitive\"): a key never reserved, K in upper case, reads K's reservation",
		expect: inContract(contract, "checkDistinctText")},
	{name: "ctl-expiry-session-async", cs: "C28-10", b: expirySessionAsync, claims: claimsOfA,
		breaks: "the expiry job runs SET synchronous_commit = off without LOCAL (\"a job lost in a crash is run again\"): the pooled connection keeps it, and the Reserves that borrow it next are acknowledged before they are durable",
		expect: inContractAfter(contract, "checkSessionsUntouched", "checkExpiryTiming")},
	{name: "ctl-release-leaks-conn", cs: "new", b: releaseLeaksConn, claims: claimsOfA,
		breaks: "Release takes a connection of the pool and gives it back after its statement, not in a defer: a Release whose statement fails (its caller gave up) keeps the connection for good, and a few faults later the pool is empty",
		expect: inContractThrough(contract, "checkBlockedCallsFail")},
	{name: "ctl-purge-ended", cs: "C28-04", b: purgeEnded, claims: claimsOfA,
		breaks: "the expiry job deletes RELEASED and EXPIRED rows a week past their expires_at (\"nobody resends a key after a week; the table stays small\"): an old key is new again and takes a unit",
		expect: inContract(contract, "checkYearsLater")},
	{name: "ctl-cart-cap", cs: "C28-04", b: cartCap, claims: claimsOfA,
		breaks: "a user who holds 10 active reservations, on any SKUs, is refused USER_LIMIT (\"a cart holds 10 items\"): the contract limits one per user and SKU",
		expect: inContract(contract, "checkOneUserManySKUs")},
	{name: "ctl-user-alias-folded", cs: "C28-04", b: userAliasFolded, claims: claimsOfA,
		breaks: "the one-active-per-user index is on the e-mail canonical form of user_id, lower case without a +tag (\"anti-scalping: one inbox, one customer\"): jane.doe+b@gmail.com is refused USER_LIMIT while Jane.Doe+a@Gmail.com holds the SKU",
		expect: inContract(contract, "checkDistinctText")},
	{name: "ctl-release-refused-zero", cs: "C28-08", b: releaseRefusedZero, claims: claimsOfA,
		breaks: "Release runs at REPEATABLE READ and answers 0 when refused with 40001 (\"another transition moved it first\"): behind a reserve of another key that changed the stock row, a HELD reservation is answered 0 and stays HELD",
		expect: inContract(contract, "checkTransitionsBehindAttempt")},
	{name: "ctl-id-int4", cs: "new", b: idInt4, claims: claimsOfA,
		breaks: "the reservation id is int4 (\"no sale has two billion reservations\"), but the table outlives every sale and refused attempts take ids too: once the id passes 2^31, every Reserve fails",
		expect: inContract(contract, "checkIdsPastInt4")},
	{name: "ctl-expire-some-skus", cs: "C28-10", b: expireSomeSKUs, claims: claimsOfA,
		breaks: "a run of the expiry job moves the due rows of at most 32 SKUs (\"a run locks no more than 32 stock rows; the job runs every second\"): the other SKUs' due holds keep their units past expiry",
		expect: inContract(contract, "checkExpireAllDue")},
	{name: "ctl-audit-two-reads", cs: "new", b: auditTwoReads, claims: claimsOfA,
		breaks: "Audit reads the stock, then the active reservations, in two statements (\"one GROUP BY is cheaper for the dashboard that polls it\"): a sale committed between them shows as drift that is not there, or hides a real one",
		expect: inContract(contract, "checkAuditOneSnapshot")},
	{name: "ctl-key-per-sku-bare", cs: "C28-04", b: keyPerSKU, claims: claimsOfA, reserveOnly: true,
		breaks: "request_key is unique per SKU only, in a strategy with Reserve and Lookup only: the check's attempt is a plain request held at its COMMIT by a deferred trigger, and the same key sent for another SKU behind it is HELD a second time instead of KEY_REUSED",
		expect: inContract(contract, "checkConflictBehind")},
	{name: "ctl-audit-two-reads-bare", cs: "new", b: auditTwoReads, claims: claimsOfA, reserveOnly: true,
		breaks: "Audit reads the stock, then the active reservations, in two statements, in a strategy with Reserve and Lookup only: no attempt held open for the check to commit a sale while Audit reads, so a plain request is held at its COMMIT by a deferred trigger",
		expect: inContract(contract, "checkAuditOneSnapshot")},
	{name: "ctl-expire-skew", cs: "C28-10", b: expireSkew, claims: claimsOfA,
		breaks: "the expiry job's cutoff is now() + 50 ms, a clock-skew allowance with the wrong sign: a reservation expires up to 50 ms before its time",
		expect: inContract(contract, "checkJustPast")},
	{name: "ctl-stock-smallint", cs: "new", b: stockSmallint, claims: claimsOfA,
		breaks: "the stock's counters are smallint (\"a SKU is one show's seats\"): a SKU of more than 32,767 units, which the contract allows, cannot be opened",
		expect: inContract(contract, "checkBigTotal")},
	{name: "ctl-lookup-error-not-found", cs: "new", b: lookupErrorNotFound, claims: claimsOfA,
		breaks: "Lookup answers NOT_FOUND when its read fails (a lock wait its caller gave up on, a broken connection): the caller resolving an unknown outcome is told its reservation does not exist",
		expect: inContract(contract, "checkBlockedCallsFail")},
	{name: "ctl-confirm-skew", cs: "C28-08", b: confirmSkew, claims: claimsOfA,
		breaks: "ConfirmBeforeExpiry refuses a reservation whose expires_at is less than 50 ms ahead, a clock-skew margin on the wrong side: a payment in a hold's last 50 ms is refused",
		expect: inContract(contract, "checkJustPast")},
	{name: "ctl-release-error-zero", cs: "new", b: releaseErrorZero, claims: claimsOfA,
		breaks: "Release answers 0 when its statement fails (a lock wait its caller gave up on): the caller is told the reservation was not HELD while it still is",
		expect: inContract(contract, "checkBlockedCallsFail")},
	{name: "ctl-sku-of-any-deployment", cs: "new", b: skuOfAnyDeployment, claims: claimsOfA,
		breaks: "Reserve knows a SKU when the database has stock for it, whichever deployment loaded it: one deployment sells another's units",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-key-like", cs: "C28-04", b: keyLike, claims: claimsOfA,
		breaks: "a key is looked up with request_key LIKE $1 (\"= and LIKE agree without wildcards\"): a key never reserved, with '_' or '%' in it, reads the reservation of a key it matches (outsider rounds 47 and 48)",
		expect: inContract(contract, "checkDistinctText")},
	{name: "ctl-replay-sku-folded", cs: "C28-04", b: replaySKUFolded, claims: claimsOfA,
		breaks: "a known key sent again by its owner is REPLAY when its SKU matches the request's ignoring case: the key sent for another SKU, whose name differs only in case, is not KEY_REUSED (outsider rounds 47 and 48)",
		expect: inContract(contract, "checkDistinctText")},
	{name: "ctl-own-sku-folded", cs: "new", b: ownSKUFolded, claims: claimsOfA,
		breaks: "Reserve takes a SKU as the deployment's when it matches one of them ignoring case: a request for a SKU no deployment sells is not BAD_REQUEST (outsider round 47)",
		expect: inContract(contract, "checkDistinctText")},
	{name: "ctl-limit-by-concat-user-first", cs: "C28-04", b: limitByConcatUserFirst, claims: claimsOfA,
		breaks: "the one-active-per-user index is on user_id || ':' || sku: user \"u:x\" asking for SKU \"S\" is refused because user \"u\" holds SKU \"x:S\" (outsider round 48)",
		expect: inContract(contract, "checkJoinedText")},
	{name: "ctl-validate-by-runes", cs: "new", b: validateByRunes, claims: claimsOfA,
		breaks: "a request's key and user are held to their limits in characters, not bytes: a key of 128 characters and 200-odd bytes is stored (outsider round 47)",
		expect: expect("bad-input", contract)},
	{name: "ctl-validate-no-controls", cs: "new", b: validateNoControls, claims: claimsOfA,
		breaks: "a request's text is checked for length, UTF-8 and NUL, not for the other control characters: a key with a line break in it is stored (outsider round 47)",
		expect: expect("bad-input", contract)},
	{name: "ctl-lock-timeout-user-limit", cs: "C28-14", b: lockTimeoutUserLimit, claims: claimsOfA,
		breaks: "reserves with lock_timeout 2 s and answers a lock not granted in time USER_LIMIT: a request that waited on the key or the user of an attempt that then rolled back is refused for a limit nobody reached (outsider round 48)",
		expect: inContractAfter(contract, "checkOutlastRefusals", "checkWaitOutlastsTimeouts")},
	{name: "ctl-ttl-rounded-millis", cs: "new", b: ttlRoundedMillis, claims: claimsOfA,
		breaks: "the TTL is rounded to the nearest millisecond: a reservation is held up to half a millisecond longer or shorter than asked (outsider round 48)",
		expect: inContract(contract, "checkTTLMicroseconds")},
	{name: "ctl-session-stamps-by-app-clock", cs: "new", b: sessionStampsByAppClock, claims: claimsOfA,
		breaks: "Reserve in an attempt held open stamps expires_at as the application's time.Now() plus the TTL, while the expiry job keeps to the database's now(): where the clocks differ, the attempt's reservations expire early or late (outsider round 48)",
		expect: inContract(contract, "checkClockAhead")},
	{name: "ctl-held-job-by-app-clock", cs: "new", b: heldJobByAppClock, claims: claimsOfA,
		breaks: "the expiry job held open compares expires_at with the application's time.Now(), while the plain job keeps to the database's now(): where the clocks differ, a maintenance sweep expires late or early (outsider round 48)",
		expect: inContract(contract, "checkClockAhead")},
	{name: "ctl-cancel-is-busy", cs: "new", b: cancelIsBusy, claims: claimsOfA,
		breaks: "a Reserve whose caller cancelled answers BUSY (\"nothing was decided\"), also when its COMMIT was in flight and went through: the caller is told nothing was written, and a reservation was (outsider round 47)",
		expect: expect("commit-timeout", contract)},
	{name: "ctl-release-deadline-zero", cs: "new", b: releaseDeadlineZero, claims: claimsOfA,
		breaks: "Release answers 0 when its deadline passed (\"it did not get to run\"): a release that waited behind a lock until its deadline tells the caller the reservation was not HELD (outsider round 47)",
		expect: inContract(contract, "checkBlockedCallsFail")},
	{name: "ctl-expire-give-up-zero", cs: "C28-10", b: expireGiveUpZero, claims: claimsOfA,
		breaks: "the expiry job answers 0 units and no error when its context ended (\"the next tick does it\"): a job whose COMMIT was in flight reports none of the units it gave back (outsider round 47)",
		expect: join(inContract(contract, "checkBlockedCallsFail"), expect("commit-timeout", strategy.Conserves))},
	{name: "ctl-attach-skips-validate", cs: "C28-15", b: attachSkipsValidate, claims: claimsOfA,
		breaks: "Attach compares the configured totals with the stored ones and checks nothing else: a config Open refuses (a SKU listed twice, negative nodes, shares that do not sum up) is attached (outsider round 49)",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-attach-allows-less", cs: "C28-15", b: attachAllowsLess, claims: claimsOfA,
		breaks: "Attach refuses a configured total only when it is more than the stored one (\"a smaller config sells less\"): a process attached with another total than the stock was loaded with serves (outsider round 49)",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-attach-without-tables", cs: "C28-15", b: attachWithoutTables, claims: claimsOfA,
		breaks: "Attach to a database without the strategy's tables starts anyway (\"the loader has not run yet\"), and every call then fails (outsider round 49)",
		expect: inContract(contract, "checkConcurrentFirstOpens")},
	{name: "ctl-ended-key-sold-out", cs: "C28-04", b: endedKeySoldOut, claims: claimsOfA,
		breaks: "the reserve path looks the key up among active reservations, then answers SOLD_OUT when the SKU has no unit, before its insert would meet the key: a released key resent by its owner on a sold-out SKU is SOLD_OUT, not REPLAY (outsider round 49)",
		expect: inContract(contract, "checkEndedKeyWhenSoldOut")},
	{name: "ctl-attach-first-sku-only", cs: "C28-15", b: attachFirstSKUOnly, claims: claimsOfA,
		breaks: "Attach checks the first SKU of its config against the stock and trusts the rest: a SKU never loaded, or loaded with another total, after one that matches is attached (outsider round 50)",
		expect: inContract(contract, "checkConfig")},
	{name: "ctl-attach-makes-schema", cs: "new", b: attachMakesSchema, claims: claimsOfA,
		breaks: "Attach makes the schema before it looks for the stock: refused on a database where nothing was opened, it leaves the strategy's tables there (outsider round 50)",
		expect: inContract(contract, "checkConcurrentFirstOpens")},
	{name: "ctl-release-stamps-now", cs: "C28-07", b: releaseStampsNow, claims: claimsOfA,
		breaks: "Release sets expires_at to now() (\"the hold is over\"): the released reservation reads a deadline no answer ever carried (outsider round 51)",
		expect: inContract(contract, "checkTransitionKeepsDeadline")},
	{name: "ctl-reserve-ignores-give-up", cs: "new", b: reserveIgnoresGiveUp, claims: claimsOfA,
		breaks: "Reserve runs its statements under context.WithoutCancel (\"a reservation half made is worse than a late one\"): a request whose COMMIT waits is never given up, and its caller waits with it (outsider rounds 52 to 54: m26, b29, m24 hung the kit until go test's timeout)",
		expect: expect("commit-timeout", contract)},
	{name: "ctl-release-leaks-tx", cs: "new", b: releaseLeaksTx, claims: claimsOfA,
		breaks: "Release commits its transaction only when it moved a row (\"nothing to commit\"): a Release of a key it does not move leaves the transaction open for good, and whatever it read waits for it (outsider round 53's b30 and b31 hung the deployment contract this way)",
		expect: inContractAfter(contract, "checkLeavesNoTransactionOpen", "checkConfig")},
	{name: "ctl-restart-index-panics", cs: "new", b: restartIndexes, claims: claimsOfA,
		breaks: "Restart indexes its nodes without a range check: Restart(2) of two nodes panics with Go's own index error instead of answering strategy.ErrNodeRange (outsider round 50)",
		expect: inContract(contract, "checkConfig")},
}

// All returns every negative control: the copies of strategy A, then the
// controls of other strategies' designs.
func All() []Control {
	out := make([]Control, len(specs))
	for i, s := range specs {
		out[i] = Control{Meta: meta(s), Case: s.cs, Breaks: s.breaks, Expect: s.expect, Race: s.race, Admission: s.admission}
	}
	out = append(out, lockOnly())
	out = append(out, lockMistakes()...)
	out = append(out, counterMistakes()...)
	out = append(out, combineMistakes()...)
	out = append(out, onetripMistakes()...)
	out = append(out, advisorylockMistakes()...)
	out = append(out, cutMistakes()...)
	out = append(out, hotrowMistakes()...)
	out = append(out, slotrowsMistakes()...)
	return append(out, memquotaControls()...)
}

// The controls run in helper processes too (the kill scenarios), which find
// strategies by name.
func init() {
	for _, c := range All() {
		strategytest.RegisterForHelpers(c.Meta)
	}
}

// inContract is a violation of claims the deployment contract's check
// must find; the scenario runs that check alone (strategytest.Env.Checks),
// so a control pays for the check it breaks, not for sixty others.
func inContract(claims strategy.Claims, check string) []Expectation {
	return []Expectation{{Scenario: strategytest.KindDeploymentContract, Claim: claims, Check: check}}
}

// inContractAfter is inContract for a check that reads what the checks
// before it left (checkSessionsUntouched): those run first.
func inContractAfter(claims strategy.Claims, check string, before ...string) []Expectation {
	return []Expectation{{Scenario: strategytest.KindDeploymentContract, Claim: claims, Check: check, Runs: append(before, check)}}
}

// inContractThrough is a violation of claims that a check every trial
// ends with must find (it has no name), once the deployment contract's
// checks named in runs have driven the strategy down the broken path.
func inContractThrough(claims strategy.Claims, runs ...string) []Expectation {
	return []Expectation{{Scenario: strategytest.KindDeploymentContract, Claim: claims, Runs: runs}}
}
