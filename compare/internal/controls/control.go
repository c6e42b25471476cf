package controls

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// breakage is the one mistake of a control.
type breakage int

const (
	correct breakage = iota
	// releaseWithoutStatusCheck (C28-10): the expiry job selects due rows
	// without status = 'HELD' and returns one unit per id it read.
	releaseWithoutStatusCheck
	// splitRelease (C28-11): the expiry job returns stock in one transaction
	// and moves the status in a second one; the first run dies between them
	// and is rerun.
	splitRelease
	// checkThenInsert (C28-12): the per-user limit is a SELECT before the
	// INSERT, with no partial unique index behind it.
	checkThenInsert
	// unconditionalDecrement: UPDATE ... SET available = available - 1
	// without available > 0, on a table without the CHECK.
	unconditionalDecrement
	// lostUpdate: SELECT available, decide in the client, UPDATE ... SET
	// available = <read> - 1.
	lostUpdate
	// expireConfirmed: the expiry job moves CONFIRMED rows too.
	expireConfirmed
	// expireCountsRead: the expiry job moves the ids it read WHERE status =
	// 'HELD', but returns len(ids) units.
	expireCountsRead
	// expireByIDsRead: the expiry job reads the due HELD ids, then moves
	// them by id alone, without status = 'HELD' and without a lock, and
	// gives back a unit per row it moved.
	expireByIDsRead
	// keyNotUnique: no unique index on request_key; SELECT by key first.
	keyNotUnique
	// uniqueViolationIsLimit: every 23505 answers USER_LIMIT.
	uniqueViolationIsLimit
	// releaseNoStatusCheck: Release without status = 'HELD'.
	releaseNoStatusCheck
	// releaseReadThenMove: Release reads the row, and only if it was
	// HELD moves it with status <> 'RELEASED' (which stops a second
	// Release, not a Confirm committed in between).
	releaseReadThenMove
	// releaseRefusesDue: Release moves only rows whose expires_at has not
	// passed, as if a due row were already expired.
	releaseRefusesDue
	// replayFoldsConfirmed: the reserve path's lookup of a known key reads
	// CONFIRMED as HELD, so a paid reservation's request sent again is a
	// REPLAY that says HELD.
	replayFoldsConfirmed
	// resendAfterErrorSoldOut: a request whose earlier attempt failed
	// with an error, sent again and finding no row, is answered SOLD_OUT
	// ("it failed: the stock must have run out").
	resendAfterErrorSoldOut
	// confirmNoStatusCheck: Confirm without status = 'HELD'.
	confirmNoStatusCheck
	// releaseKeepsUnit: Release moves the row, returns no unit.
	releaseKeepsUnit
	// soldOutWhenLocked: FOR UPDATE NOWAIT on the stock row; 55P03 is
	// SOLD_OUT.
	soldOutWhenLocked
	// restartFromConfig: Restart resets available to total.
	restartFromConfig
	// confirmIgnoresExpiry: ConfirmBeforeExpiry does not look at
	// expires_at.
	confirmIgnoresExpiry
	// grantsAll: Meta.Setup creates the schema as the owner role, then
	// grants the runtime role ALL on its tables (TRUNCATE and DELETE among
	// them) instead of what serving uses (setup.go).
	grantsAll
	// errorIsSoldOut: a Reserve whose transaction fails with an error (a
	// connection lost at COMMIT among them) answers SOLD_OUT, as if a
	// failure surely sold nothing.
	errorIsSoldOut
	// replayIsHeld: a known key of the same user and SKU is answered HELD
	// again instead of REPLAY.
	replayIsHeld
	// asyncCommit: every reservation commits with synchronous_commit =
	// off: COMMIT returns before its WAL is flushed, and waits for no
	// standby.
	asyncCommit
	// ttlWrongUnit: the TTL is sent as milliseconds and read as seconds,
	// so every reservation is held 1000 times as long as asked.
	ttlWrongUnit
	// limitPerUser: the one-active rule is a unique index on user_id
	// alone: a user holding one SKU is refused every other SKU.
	limitPerUser
	// limitCountsEnded: the one-active index has no WHERE status IN
	// ('HELD','CONFIRMED'): a released or expired reservation still
	// refuses its user the SKU.
	limitCountsEnded
	// limitHeldOnly: the one-active index has WHERE status = 'HELD': a
	// user whose reservation was confirmed (paid) may reserve the SKU
	// again.
	limitHeldOnly
	// releaseConfirmed: Release moves HELD or CONFIRMED rows: a late
	// cancel gives back a unit that was paid for.
	releaseConfirmed
	// releaseExpired: Release moves HELD or EXPIRED rows: a cancel after
	// the expiry job gives the unit back a second time.
	releaseExpired
	// openReloadsStock: Open loads stock with ON CONFLICT DO UPDATE: a
	// second Open of a SKU resets its stock instead of failing with
	// ErrStockExists.
	openReloadsStock
	// expireEverySKU: the expiry job has no sku = ANY($1): it expires the
	// due reservations of every deployment in the database.
	expireEverySKU
	// expireHeldOpenEverySKU: the expiry job held open (a maintenance
	// sweep in a transaction) has no sku = ANY($1); the plain job has it.
	expireHeldOpenEverySKU
	// expireEarly: the expiry job compares expires_at with now() plus two
	// seconds: a reservation is expired up to two seconds before its time.
	expireEarly
	// confirmEarly: ConfirmBeforeExpiry compares expires_at with now()
	// plus two seconds: a payment in the last two seconds is refused.
	confirmEarly
	// answerExpiresByAppClock: a HELD answer's ExpiresAt is the
	// application's clock plus the TTL, while the row's expires_at is the
	// database's now() plus the TTL: the client is told another deadline
	// than the one the job keeps.
	answerExpiresByAppClock
	// expireByAppClock: the expiry job compares expires_at, stamped by the
	// database's clock, with the application's (a parameter, time.Now()):
	// with the database's clock ahead, due reservations are left HELD.
	expireByAppClock
	// confirmByAppClock: ConfirmBeforeExpiry compares expires_at, stamped
	// by the database's clock, with the application's: with the database's
	// clock ahead, a late payment is accepted.
	confirmByAppClock
	// makeDueNear: MakeDue moves expires_at 400 seconds back, not 400
	// days ("due is due"): the reservations are due, but inside any window
	// a job might look back over (outsider round 33's m9).
	makeDueNear
	// stockOffByOne: Open loads a stock of n as n+1 units, total and
	// available both, so the audit, reading the same row, agrees with it.
	stockOffByOne
	// releaseEverySKU: Release gives the unit back to every SKU of the
	// deployment (sku = ANY of its SKUs) instead of the released row's.
	releaseEverySKU
	// keyColumnNarrow: request_key is varchar(64), where the contract
	// allows keys of strategy.MaxKeyLen (128) bytes.
	keyColumnNarrow
	// ttlWholeSeconds: the TTL is sent as whole seconds (truncated), so a
	// TTL under a second expires at once and every other loses its
	// fraction.
	ttlWholeSeconds
	// confirmAgain: Confirm moves HELD or CONFIRMED rows: a payment
	// callback delivered twice is reported as moving the row twice.
	confirmAgain
	// soldOutFirst: the deployment remembers the SKUs it answered
	// SOLD_OUT and answers SOLD_OUT to any request for them at once, before
	// it looks at the key or the user (until a release or an expiry gives
	// a unit back).
	soldOutFirst
	// replayExtendsHold: a request sent again for a HELD reservation
	// moves its expires_at to the new request's TTL from now: a client
	// that resends keeps its unit as long as it likes.
	replayExtendsHold
	// skuOfAnyDeployment: Reserve takes a SKU as known when the database
	// has stock for it, whichever deployment loaded it, instead of when
	// the deployment's config lists it.
	skuOfAnyDeployment
	// keyPerSKU: the key is unique per SKU (a unique index on sku,
	// request_key), looked up by key alone first: a key reused for another
	// SKU is KEY_REUSED, but one key sent at once for two SKUs is HELD
	// twice.
	keyPerSKU
	// keyCaseFolded: keys are compared without case (a unique index and
	// the lookup on lower(request_key)): a key that differs from another
	// only in case is answered as that one.
	keyCaseFolded
	// ttlCapped: a TTL over an hour is cut to an hour.
	ttlCapped
	// lockTimeoutSoldOut: the reservation runs with lock_timeout 500 ms
	// and answers a lock not granted in time (55P03) SOLD_OUT.
	lockTimeoutSoldOut
	// lockTimeoutLongSoldOut: the same with lock_timeout 15 s, longer than
	// any lock wait of the kit's but the one it holds past the timeouts it
	// sees set.
	lockTimeoutLongSoldOut
	// deadlineSoldOut: the reservation runs under a 3 s deadline of its
	// own, and a request that meets it while its caller still waits is
	// answered SOLD_OUT ("that long a wait means the SKU is gone").
	deadlineSoldOut
	// expireLag: the expiry job moves rows only half a second after their
	// expires_at ("clock-skew tolerance").
	expireLag
	// confirmGrace: ConfirmBeforeExpiry accepts a payment up to half a
	// second after expires_at.
	confirmGrace
	// limitBeforeKey: the user's other active reservation of the SKU is
	// looked for before the key: a known key sent by a user who holds the
	// SKU under another key is USER_LIMIT, not KEY_REUSED.
	limitBeforeKey
	// lookupIgnoresClosed: Lookup on a node that was restarted or closed
	// still answers.
	lookupIgnoresClosed
	// lookupCachesOwn: a node answers Lookup from the reservations it made
	// itself, forgetting one only when it moves it: another node's release
	// or confirm leaves it reading HELD.
	lookupCachesOwn
	// endedKeyReplays: a key whose reservation was released or expired is
	// answered REPLAY whoever sends it, not KEY_REUSED to another user.
	endedKeyReplays
	// lookupOwnSKUs: Lookup finds only keys of the deployment's own SKUs.
	lookupOwnSKUs
	// replayOwnSKUs: the reserve path looks a known key up among the
	// deployment's own SKUs only: another deployment's key finds no owner,
	// then meets the unique index, and is answered USER_LIMIT.
	replayOwnSKUs
	// knownKeyFirst: the reserve path answers a known key (REPLAY or
	// KEY_REUSED) before it checks that the SKU is the deployment's.
	knownKeyFirst
	// openPartial: Open loads each SKU in a transaction of its own and
	// reports ErrStockExists for the ones that had stock, keeping the rest.
	openPartial
	// replayDueExpired: the reserve path reports a known key's HELD
	// reservation past its expires_at as EXPIRED, though no transition
	// moved it (Lookup still reads HELD).
	replayDueExpired
	// expireWindow: ExpireDue moves only rows that fell due within the
	// last 6 hours (a bounded scan): a hold overdue for longer, as after
	// the job was down, is never expired.
	expireWindow
	// lateConfirmWindow: ConfirmUntilExpired accepts a late payment only
	// up to 10 minutes after expires_at, though no expiry moved the row.
	lateConfirmWindow
	// closeReleases: Close releases the HELD reservations of the
	// deployment's SKUs ("graceful shutdown"), giving their units back.
	closeReleases
	// storableNULOnly: Lookup, Confirm and Release screen out keys with a
	// NUL byte, not keys that are not UTF-8, which reach PostgreSQL and
	// fail there (22021).
	storableNULOnly
	// confirmSkipLocked: Confirm moves the row only if it can lock it at
	// once (FOR UPDATE SKIP LOCKED), and answers false when another
	// transaction holds it.
	confirmSkipLocked
	// soldOutPerProcess: a deployment (one process of the service)
	// remembers the SKUs it found sold out and, after looking at the key
	// and the user, answers SOLD_OUT from that memory until its own
	// Release or ExpireDue gives a unit back: a unit released through
	// another process is never sold by this one.
	soldOutPerProcess
	// schemaWithoutLock: Open creates the schema without the advisory
	// lock, trusting IF NOT EXISTS: first Opens at once on an empty
	// database fail on the catalog's unique indexes.
	schemaWithoutLock
	// limitByConcat: the one-active-per-user index is on sku || ':' ||
	// user_id: user "vip:u" on SKU "S" meets user "u" on SKU "S:vip".
	limitByConcat
	// keyPrefix64: keys are unique, and looked up, on their first 64
	// characters (a prefix index).
	keyPrefix64
	// skusAsCSV: Release passes the deployment's SKUs to SQL as one
	// comma-separated text: a SKU with a comma is not found.
	skusAsCSV
	// expireRetryCounts: ExpireDue runs at SERIALIZABLE in two
	// statements (move the due rows, then give their units back) and
	// retries after 40001, adding each try's moved rows to one count: a
	// job refused once reports the first try's units too.
	expireRetryCounts
	// attachRecounts: Attach "heals" the stock rows, setting available to
	// total minus the active rows it counted first: behind an attempt in
	// flight, it writes a count from before that attempt's commit.
	attachRecounts
	// ttlJustified: expires_at is now() + justify_hours(ttl): a TTL of 24
	// hours becomes '1 day', which is 23 or 25 hours across a change to or
	// from daylight saving time.
	ttlJustified
	// keyByHash: a key is looked up by hashtext(request_key), as a hash
	// index or a 32-bit key column would find it: a key whose hash another
	// key's equals reads that key's reservation.
	keyByHash
	// limitSkipsDue: the per-user limit is a SELECT, serialised per SKU by
	// the stock row's lock, that skips HELD rows past their expires_at
	// (and no unique index backs it): the user of a due reservation no job
	// has moved gets a second one.
	limitSkipsDue
	// confirmCart: Confirm confirms every HELD reservation of the key's
	// user in the deployment ("pay for the cart").
	confirmCart
	// limitCacheNode: a node remembers which users it sold a SKU to and
	// answers USER_LIMIT from memory, forgetting a user only when a
	// Release reaches this node (or MakeDue, time passing, reaches all).
	limitCacheNode
	// sessionAnySKU: Session.Reserve validates the request's fields, not
	// that its SKU is the deployment's.
	sessionAnySKU
	// lazyExpiryCount: a HELD reservation past its expires_at counts as a
	// free unit when selling, without being moved (on a table without the
	// CHECK): its late payment then confirms a unit sold again.
	lazyExpiryCount
	// expireInBatches: ExpireDue moves at most 1,000 due reservations a call.
	expireInBatches
	// expiresWithoutZone: expires_at is a timestamp without time zone: the
	// session's wall clock, read back as if it were UTC.
	expiresWithoutZone
	// keyTrimmed: keys are looked up with their spaces trimmed ("proxies
	// pad Idempotency-Key headers"): " K" reads K's reservation.
	keyTrimmed
	// keyFolded: keys are looked up in Unicode compatibility form (NFKC,
	// "the IME types order numbers full-width"): a key never reserved, K in
	// full-width forms, reads K's reservation.
	keyFolded
	// releaseRefusedZero: Release runs at REPEATABLE READ ("one snapshot for
	// the row and its unit") and answers 0 when refused with 40001 ("another
	// transition moved it first"), also when the conflict was a reserve of
	// another key on the stock row.
	releaseRefusedZero
	// idInt4: the reservation id is int4 ("no sale has two billion
	// reservations"), fed by a bigint sequence: past 2^31, every Reserve
	// fails.
	idInt4
	// expireSomeSKUs: a run of the expiry job moves the due rows of at most
	// 32 SKUs ("a run locks no more than 32 stock rows").
	expireSomeSKUs
	// auditTwoReads: Audit reads the stock and the active reservations in
	// two statements ("one GROUP BY is cheaper for the dashboard"): two
	// snapshots.
	auditTwoReads
	// expireSkew: the expiry job's cutoff is now() plus 50 ms, a "clock
	// skew allowance" with the wrong sign.
	expireSkew
	// stockSmallint: the stock's counters are smallint ("a SKU is one
	// show's seats"): a SKU of more than 32,767 units cannot be opened.
	stockSmallint
	// lookupErrorNotFound: Lookup answers NOT_FOUND when its read fails
	// ("clients poll until their reservation shows up").
	lookupErrorNotFound
	// confirmSkew: ConfirmBeforeExpiry refuses a reservation whose
	// expires_at is within 50 ms ("the clocks may differ").
	confirmSkew
	// releaseErrorZero: Release answers 0 when its statement fails.
	releaseErrorZero
	// keyDashFolded: keys are looked up with Unicode dashes read as '-'
	// and characters of no width dropped ("order numbers pasted from PDFs
	// and e-mails"): K with an en dash reads K's reservation.
	keyDashFolded
	// keyUUIDFolded: a UUID-shaped key is looked up in canonical form
	// (RFC 4122 reads hex digits without case; braces, URN and hyphens
	// dropped): K in upper case reads K's reservation.
	keyUUIDFolded
	// grantOption: Meta.Setup grants strategy A's privileges WITH GRANT
	// OPTION ("the deploy step, run as the service's role, grants
	// reporting its read access").
	grantOption
	// grantsSequenceAll: Meta.Setup grants ALL on the reservation ids'
	// sequence ("an operator can setval after a restore"), where nextval
	// needs USAGE alone: the runtime role may rewind it.
	grantsSequenceAll
	// grantsTotal: Meta.Setup grants UPDATE of the stock's total beside
	// available ("a restock endpoint is on the roadmap"): the runtime role
	// may raise a SKU's total.
	grantsTotal
	// expirySessionAsync: the expiry job sets synchronous_commit off
	// without LOCAL ("a job that is lost in a crash is run again"): the
	// connection keeps it, and the Reserves that borrow it next commit
	// before their WAL is flushed.
	expirySessionAsync
	// releaseLeaksConn: Release takes a connection of the pool and gives
	// it back after its statement, not in a defer: a statement that fails
	// keeps it for good.
	releaseLeaksConn
	// purgeEnded: the expiry job deletes RELEASED and EXPIRED rows whose
	// expires_at is a week past ("nobody resends a key after a week; the
	// table stays small"): an old key is then new again.
	purgeEnded
	// cartCap: a user who holds 10 active reservations, on any SKUs, is
	// refused USER_LIMIT ("a cart holds 10 items").
	cartCap
	// userAliasFolded: the one-active-per-user index is on the e-mail
	// canonical form of user_id, lower case without a +tag
	// ("anti-scalping: one inbox, one customer").
	userAliasFolded
	// resendUnsureThenReplay: a request whose earlier attempt failed with
	// an error, sent again, fails once more (as a resend that meets a
	// deadline on a loaded machine does), then is answered REPLAY without
	// a row ("it failed twice: the first must have gone through").
	resendUnsureThenReplay
	// definerRestock: Meta.Setup also creates a SECURITY DEFINER restock
	// function for an operator's console and never revokes EXECUTE from
	// PUBLIC: any role raises a SKU's total through it.
	definerRestock
	// keyLike: a key is looked up with request_key LIKE $1 ("= and LIKE
	// are the same without wildcards"): a key with '_' or '%' that was
	// never reserved reads the reservation of a key it matches.
	keyLike
	// replaySKUFolded: a known key sent again by its owner is REPLAY when
	// its SKU matches the request's ignoring case (strings.EqualFold).
	replaySKUFolded
	// ownSKUFolded: Reserve takes a SKU as the deployment's when it
	// matches one of them ignoring case.
	ownSKUFolded
	// limitByConcatUserFirst: the one-active-per-user index is on
	// user_id || ':' || sku: user "u:x" asking for SKU "S" meets user "u"
	// holding SKU "x:S".
	limitByConcatUserFirst
	// validateByRunes: a request's key, user and SKU are held to their
	// limits in characters, not bytes (utf8.RuneCountInString).
	validateByRunes
	// validateNoControls: a request's text is checked for length, UTF-8
	// and NUL, but not for the other control characters.
	validateNoControls
	// lockTimeoutUserLimit: the reservation runs with lock_timeout 2 s and
	// answers a lock not granted in time (55P03) USER_LIMIT ("the index it
	// waited on is the user's").
	lockTimeoutUserLimit
	// ttlRoundedMillis: the TTL is rounded to the nearest millisecond.
	ttlRoundedMillis
	// sessionStampsByAppClock: Reserve in an attempt held open stamps
	// expires_at as the application's time.Now() plus the TTL.
	sessionStampsByAppClock
	// heldJobByAppClock: the expiry job held open (ExpirySession)
	// compares expires_at with the application's time.Now(); the plain
	// job keeps to now().
	heldJobByAppClock
	// cancelIsBusy: a Reserve whose context was cancelled answers BUSY
	// ("the caller left before anything was decided"), also when its
	// COMMIT was in flight.
	cancelIsBusy
	// releaseDeadlineZero: Release answers 0 when its deadline passed
	// ("it did not get to run"); other errors are returned.
	releaseDeadlineZero
	// expireGiveUpZero: ExpireDue answers 0 units and no error when its
	// context ended ("the next tick does it").
	expireGiveUpZero
	// attachSkipsValidate: Attach compares the configured totals with the
	// stored ones and nothing else: a SKU listed twice, negative nodes or
	// shares that do not sum up are attached.
	attachSkipsValidate
	// attachAllowsLess: Attach refuses a configured total only when it is
	// more than the stored one ("a smaller config sells less, so it is
	// safe").
	attachAllowsLess
	// attachWithoutTables: Attach to a database without the strategy's
	// tables starts anyway ("the loader has not run yet").
	attachWithoutTables
	// endedKeySoldOut: the reserve path first looks the key up among active
	// reservations, then answers SOLD_OUT when the SKU has no unit, before
	// its insert would meet the key: an ended key resent on a sold-out SKU
	// is SOLD_OUT.
	endedKeySoldOut
	// attachFirstSKUOnly: Attach checks the first SKU of its config against
	// the stock, and trusts the rest.
	attachFirstSKUOnly
	// attachMakesSchema: Attach makes the schema (CREATE TABLE IF NOT
	// EXISTS) before it looks for the stock, so an Attach to a database
	// where nothing was opened leaves tables behind though it is refused.
	attachMakesSchema
	// releaseStampsNow: Release sets expires_at to now() ("the hold is
	// over"), a deadline no answer carried.
	releaseStampsNow
	// restartIndexes: Restart indexes its nodes without a range check, so
	// a bad index panics with Go's own index error.
	restartIndexes
	// reserveIgnoresGiveUp: Reserve runs its statements under
	// context.WithoutCancel ("a reservation half made is worse than a late
	// one"): a caller's deadline or cancel never reaches it.
	reserveIgnoresGiveUp
	// releaseLeaksTx: Release runs in a transaction it commits only when
	// it moved a row ("nothing to commit"): a Release of a key it does not
	// move leaves its transaction open, and its connection out of the
	// pool, for good.
	releaseLeaksTx
)

// dashFolded and uuidFolded are the key columns' folds of keyDashFolded
// and keyUUIDFolded, over the column or parameter x.
func dashFolded(x string) string {
	return "regexp_replace(translate(" + x + ", '\u2010\u2011\u2012\u2013\u2014\u2015\u2212', '-------'), '[\u200b\u200c\u200d\u2060\ufeff\u00ad]', '', 'g')"
}

func uuidFolded(x string) string {
	return "CASE WHEN " + x + ` ~* '^(urn:uuid:)?[{]?[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}[}]?$' THEN lower(regexp_replace(` + x + `, '^urn:uuid:|[{}-]', '', 'gi')) ELSE ` + x + " END"
}

//go:embed schema.sql
var schemaSQL string

func meta(s spec) strategy.Meta {
	m := strategy.Meta{
		Name:        s.name,
		Description: "negative control: strategy A with one deliberate mistake",
		Correctness: "none: it claims what it cannot keep",
		Claims:      s.claims,
		Open: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			return open(ctx, s, cfg)
		},
		Attach: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			return attach(ctx, s, cfg)
		},
		Setup: setupOf(s),
	}
	if s.reserveOnly {
		return reserveOnlyMeta(m)
	}
	return m
}

// tables are a control's table names: its own set, so controls never share
// a table even in one database.
type tables struct{ prefix, stock, reservation string }

func tablesOf(name string) tables {
	p := strings.ReplaceAll(name, "-", "_")
	return tables{prefix: p, stock: p + "_stock", reservation: p + "_reservation"}
}

// q fills a statement's {stock} and {reservation} placeholders.
func (t tables) q(sql string) string {
	return strings.NewReplacer("{stock}", t.stock, "{reservation}", t.reservation).Replace(sql)
}

func lockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64() >> 1)
}

func open(ctx context.Context, s spec, cfg strategy.Config) (strategy.Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tb := tablesOf(s.name)
	err := pgx.BeginFunc(ctx, cfg.DB, func(tx pgx.Tx) error {
		if err := createSchema(ctx, tx, s, tb); err != nil {
			return err
		}
		for _, st := range cfg.Stock {
			insert := `INSERT INTO {stock} (sku, total, available) VALUES ($1, $2, $2) ON CONFLICT DO NOTHING`
			if s.b == openReloadsStock {
				insert = `INSERT INTO {stock} (sku, total, available) VALUES ($1, $2, $2) ON CONFLICT (sku) DO UPDATE SET total = EXCLUDED.total, available = EXCLUDED.available`
			}
			total := st.Total
			if s.b == stockOffByOne {
				total++
			}
			if s.b == openPartial {
				continue
			}
			tag, err := tx.Exec(ctx, tb.q(insert), st.SKU, total)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return fmt.Errorf("%w: %s", strategy.ErrStockExists, st.SKU)
			}
		}
		return nil
	})
	if err == nil && s.b == openPartial {
		var exists []string
		for _, st := range cfg.Stock {
			tag, ierr := cfg.DB.Exec(ctx, tb.q(`INSERT INTO {stock} (sku, total, available) VALUES ($1, $2, $2) ON CONFLICT DO NOTHING`), st.SKU, st.Total)
			if ierr != nil {
				return nil, fmt.Errorf("%s: open: %w", s.name, ierr)
			}
			if tag.RowsAffected() == 0 {
				exists = append(exists, st.SKU)
			}
		}
		if len(exists) > 0 {
			err = fmt.Errorf("%w: %s", strategy.ErrStockExists, strings.Join(exists, ", "))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: open: %w", s.name, err)
	}
	return newControl(s, cfg), nil
}

func attach(ctx context.Context, s spec, cfg strategy.Config) (strategy.Deployment, error) {
	if s.b == attachSkipsValidate {
		if cfg.DB == nil || len(cfg.Stock) == 0 {
			return nil, fmt.Errorf("%w: attach: no database or no stock", strategy.ErrConfig)
		}
	} else if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tb := tablesOf(s.name)
	if s.b == attachMakesSchema {
		if err := pgx.BeginFunc(ctx, cfg.DB, func(tx pgx.Tx) error { return createSchema(ctx, tx, s, tb) }); err != nil {
			return nil, err
		}
	}
	checked := cfg
	if s.b == attachFirstSKUOnly {
		checked.Stock = cfg.Stock[:1]
	}
	same := `s.total = c.total`
	if s.b == attachAllowsLess {
		same = `s.total >= c.total`
	}
	var n int
	if err := cfg.DB.QueryRow(ctx, tb.q(`SELECT count(*) FROM {stock} s JOIN unnest($1::text[], $2::int[]) AS c (sku, total) USING (sku) WHERE `+same),
		checked.SKUs(), totals(checked)).Scan(&n); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			if s.b == attachWithoutTables {
				return newControl(s, cfg), nil // "the loader has not run yet"
			}
			return nil, fmt.Errorf("%w: attach: no schema", strategy.ErrConfig)
		}
		return nil, err
	}
	if n != len(checked.Stock) {
		return nil, fmt.Errorf("%w: attach: %d of %d SKUs have that stock", strategy.ErrConfig, n, len(checked.Stock))
	}
	if s.b == attachRecounts {
		for _, sku := range cfg.SKUs() {
			var active int
			if err := cfg.DB.QueryRow(ctx, tb.q(`SELECT count(*) FROM {reservation} WHERE sku = $1 AND status IN ('HELD','CONFIRMED')`), sku).Scan(&active); err != nil {
				return nil, err
			}
			if _, err := cfg.DB.Exec(ctx, tb.q(`UPDATE {stock} SET available = total - $2 WHERE sku = $1`), sku, active); err != nil {
				return nil, err
			}
		}
	}
	return newControl(s, cfg), nil
}

func totals(cfg strategy.Config) []int32 {
	out := make([]int32, len(cfg.Stock))
	for i, s := range cfg.Stock {
		out[i] = int32(s.Total)
	}
	return out
}

func newControl(s spec, cfg strategy.Config) *control {
	c := &control{db: cfg.DB, t: tablesOf(s.name), skus: cfg.SKUs(), breaks: s.b, nodes: make([]*node, cfg.NodeCount())}
	for i := range c.nodes {
		c.nodes[i] = &node{c: c}
	}
	return c
}

// control is the deployment; its nodes are handles that keep nothing in
// memory.
type control struct {
	db           *pgxpool.Pool
	t            tables
	skus         []string
	breaks       breakage
	nodes        []*node
	firstRunDied atomic.Bool // splitRelease: the first expiry run has died
	soldOut      sync.Map    // soldOutFirst: the SKUs answered SOLD_OUT
	failed       sync.Map    // resendAfterErrorSoldOut, resendUnsureThenReplay: the keys whose attempt failed
	resent       sync.Map    // resendUnsureThenReplay: the failed keys whose resend has failed too
}

type node struct {
	c      *control
	closed atomic.Bool
	// own is lookupCachesOwn's cache: key -> the reservation this node made.
	own sync.Map
	// sold is limitCacheNode's cache: sku + "\x00" + user -> the key that
	// holds it.
	sold sync.Map
}

var (
	_ strategy.Deployment          = (*control)(nil)
	_ strategy.Ager                = (*control)(nil)
	_ strategy.Restarter           = (*control)(nil)
	_ strategy.Strategy            = (*node)(nil)
	_ strategy.Expirer             = (*node)(nil)
	_ strategy.Confirmer           = (*node)(nil)
	_ strategy.Releaser            = (*node)(nil)
	_ strategy.SessionOpener       = (*node)(nil)
	_ strategy.ExpirySessionOpener = (*node)(nil)
)

func (c *control) Node(i int) strategy.Strategy {
	strategy.CheckNode(i, len(c.nodes))
	return c.nodes[i]
}

// Restart replaces the node's handle. Under restartFromConfig it also sets
// available back to total, as a node that reloads its stock from config.
func (c *control) Restart(ctx context.Context, i int) error {
	if (i < 0 || i >= len(c.nodes)) && c.breaks != restartIndexes {
		return fmt.Errorf("control: restart: %w: node %d of %d", strategy.ErrNodeRange, i, len(c.nodes))
	}
	c.nodes[i].closed.Store(true)
	c.nodes[i] = &node{c: c}
	if c.breaks == restartFromConfig {
		_, err := c.db.Exec(ctx, c.t.q(`UPDATE {stock} SET available = total WHERE sku = ANY($1)`), c.skus)
		return err
	}
	return nil
}

func (c *control) Close() error {
	for _, n := range c.nodes {
		n.closed.Store(true)
	}
	if c.breaks == closeReleases {
		_, err := c.db.Exec(context.Background(), c.t.q(`
			WITH moved AS (UPDATE {reservation} SET status = 'RELEASED' WHERE sku = ANY($1) AND status = 'HELD' RETURNING sku),
			per AS (SELECT sku, count(*) AS n FROM moved GROUP BY sku)
			UPDATE {stock} s SET available = s.available + per.n FROM per WHERE s.sku = per.sku`), c.skus)
		return err
	}
	return nil
}

func (c *control) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	if c.breaks == auditTwoReads {
		return c.auditInTwoReads(ctx)
	}
	rows, err := c.db.Query(ctx, c.t.q(`
		SELECT s.sku, s.total, s.available,
		       (SELECT count(*) FROM {reservation} r WHERE r.sku = s.sku AND r.status IN ('HELD','CONFIRMED'))
		FROM {stock} s WHERE s.sku = ANY($1) ORDER BY s.sku`), c.skus)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (strategy.StockAudit, error) {
		var a strategy.StockAudit
		err := r.Scan(&a.SKU, &a.Total, &a.Available, &a.Active)
		return a, err
	})
}

// auditInTwoReads is auditTwoReads's Audit: the stock, then the active
// reservations, in two statements (two snapshots).
func (c *control) auditInTwoReads(ctx context.Context) ([]strategy.StockAudit, error) {
	rows, err := c.db.Query(ctx, c.t.q(`SELECT sku, total, available FROM {stock} WHERE sku = ANY($1) ORDER BY sku`), c.skus)
	if err != nil {
		return nil, err
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (strategy.StockAudit, error) {
		var a strategy.StockAudit
		err := r.Scan(&a.SKU, &a.Total, &a.Available)
		return a, err
	})
	if err != nil {
		return nil, err
	}
	active := map[string]int{}
	rows, err = c.db.Query(ctx, c.t.q(`SELECT sku, count(*)::int FROM {reservation} WHERE sku = ANY($1) AND status IN ('HELD','CONFIRMED') GROUP BY sku`), c.skus)
	if err != nil {
		return nil, err
	}
	var sku string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&sku, &n}, func() error { active[sku] = n; return nil }); err != nil {
		return nil, err
	}
	for i := range list {
		list[i].Active = active[list[i].SKU]
	}
	return list, nil
}

func (c *control) MakeDue(ctx context.Context, keys []string) (int, error) {
	if c.breaks == limitCacheNode { // time passing: every node's memory of these holds lapses
		for _, n := range c.nodes {
			for _, k := range keys {
				n.forgetSold(k)
			}
		}
	}
	back := "400 days"
	if c.breaks == makeDueNear {
		back = "400 seconds"
	}
	tag, err := c.db.Exec(ctx, c.t.q(`UPDATE {reservation} SET expires_at = now() - $3::interval WHERE request_key = ANY($1) AND sku = ANY($2) AND status = 'HELD'`), keys, c.skus, back)
	return int(tag.RowsAffected()), err
}

// validate is req.Validate(), or its text checks with the control's
// mistake (validateByRunes, validateNoControls).
func (c *control) validate(req strategy.Request) error {
	if c.breaks != validateByRunes && c.breaks != validateNoControls {
		return req.Validate()
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"key", req.Key, strategy.MaxKeyLen}, {"user", req.User, strategy.MaxUserLen}, {"sku", req.SKU, strategy.MaxSKULen}} {
		n := len(f.v)
		if c.breaks == validateByRunes {
			n = utf8.RuneCountInString(f.v)
		}
		control := strings.ContainsFunc(f.v, func(r rune) bool { return r < 0x20 || r == 0x7f })
		switch {
		case f.v == "":
			return &strategy.RequestError{Field: f.name, Reason: "missing"}
		case n > f.max:
			return &strategy.RequestError{Field: f.name, Reason: fmt.Sprintf("longer than %d", f.max)}
		case !utf8.ValidString(f.v) || strings.ContainsRune(f.v, 0):
			return &strategy.RequestError{Field: f.name, Reason: "not text"}
		case control && c.breaks != validateNoControls:
			return &strategy.RequestError{Field: f.name, Reason: "control character"}
		}
	}
	ttlOnly := req
	ttlOnly.Key, ttlOnly.User, ttlOnly.SKU = "k", "u", "s"
	return ttlOnly.Validate()
}

// storable is strategy.Storable, or its NUL test alone under
// storableNULOnly.
func (c *control) storable(key string) bool {
	if c.breaks == storableNULOnly {
		return !strings.ContainsRune(key, 0)
	}
	return strategy.Storable(key)
}

func (n *node) check() error {
	if n.closed.Load() {
		return strategy.ErrNodeClosed
	}
	return nil
}

func (n *node) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	if err := n.check(); err != nil && n.c.breaks != lookupIgnoresClosed {
		return strategy.Reservation{}, err
	}
	if !n.c.storable(key) {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
	}
	if r, ok := n.own.Load(key); ok {
		return r.(strategy.Reservation), nil
	}
	r, err := n.c.lookupIn(ctx, n.c.db, key)
	if err != nil && n.c.breaks == lookupErrorNotFound {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
	}
	if err == nil && n.c.breaks == lookupOwnSKUs && r.Status != strategy.StatusNotFound && !n.c.owns(r.SKU) {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
	}
	return r, err
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (c *control) lookupIn(ctx context.Context, q querier, key string) (strategy.Reservation, error) {
	r := strategy.Reservation{Key: key}
	where := `request_key = $1`
	switch c.breaks {
	case keyCaseFolded:
		where = `lower(request_key) = lower($1)`
	case keyByHash:
		where = `hashtext(request_key) = hashtext($1)`
	case keyPrefix64:
		where = `left(request_key, 64) = left($1, 64)`
	case keyTrimmed:
		where = `btrim(request_key) = btrim($1)`
	case keyFolded:
		where = `normalize(request_key, NFKC) = normalize($1, NFKC)`
	case keyDashFolded:
		where = dashFolded("request_key") + " = " + dashFolded("$1")
	case keyUUIDFolded:
		where = uuidFolded("request_key") + " = " + uuidFolded("$1::text")
	case keyLike:
		where = `request_key LIKE $1`
	}
	err := q.QueryRow(ctx, c.t.q(`SELECT request_key, user_id, sku, status, expires_at FROM {reservation} WHERE `+where+` ORDER BY reservation_id LIMIT 1`), key).
		Scan(&r.Key, &r.User, &r.SKU, &r.Status, &r.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
	}
	return r, err
}

// replayIn is the reserve path's lookup of a known key.
func (c *control) replayIn(ctx context.Context, q querier, key string) (strategy.Reservation, error) {
	r, err := c.lookupIn(ctx, q, key)
	if c.breaks == replayFoldsConfirmed && r.Status == strategy.StatusConfirmed {
		r.Status = strategy.StatusHeld
	}
	if c.breaks == replayDueExpired && r.Status == strategy.StatusHeld && time.Until(r.ExpiresAt) < 0 {
		r.Status = strategy.StatusExpired
	}
	if c.breaks == replayOwnSKUs && r.Status != strategy.StatusNotFound && !c.owns(r.SKU) {
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, err
	}
	return r, err
}

func (c *control) owns(sku string) bool {
	for _, s := range c.skus {
		if s == sku {
			return true
		}
	}
	return false
}

func (n *node) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if n.c.breaks == limitCacheNode && req.Validate() == nil {
		if k, ok := n.sold.Load(req.SKU + "\x00" + req.User); ok && k != req.Key {
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
		}
	}
	if n.c.breaks == reserveIgnoresGiveUp {
		ctx = context.WithoutCancel(ctx)
	}
	res, err := n.reserve(ctx, req)
	if err == nil && res.Outcome == strategy.OutcomeHeld {
		switch n.c.breaks {
		case lookupCachesOwn:
			n.own.Store(req.Key, res.Reservation)
		case limitCacheNode:
			n.sold.Store(req.SKU+"\x00"+req.User, req.Key)
		}
	}
	return res, err
}

// forgetSold drops key from limitCacheNode's cache.
func (n *node) forgetSold(key string) {
	n.sold.Range(func(k, v any) bool {
		if v == key {
			n.sold.Delete(k)
		}
		return true
	})
}

func (n *node) reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	if err := n.c.validate(req); err != nil {
		return strategy.BadRequest(err)
	}
	if err := n.check(); err != nil {
		return strategy.Result{}, err
	}
	outer := ctx
	if n.c.breaks == deadlineSoldOut {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
	}
	if n.c.breaks == knownKeyFirst {
		existing, err := n.c.replayIn(ctx, n.c.db, req.Key)
		if err != nil {
			return strategy.Result{}, err
		}
		if existing.Status != strategy.StatusNotFound {
			return n.c.knownKey(req, existing), nil
		}
	}
	known := n.c.owns(req.SKU)
	if n.c.breaks == ownSKUFolded {
		for _, sku := range n.c.skus {
			known = known || strings.EqualFold(sku, req.SKU)
		}
	}
	if n.c.breaks == skuOfAnyDeployment {
		if err := n.c.db.QueryRow(ctx, n.c.t.q(`SELECT EXISTS (SELECT 1 FROM {stock} WHERE sku = $1)`), req.SKU).Scan(&known); err != nil {
			return strategy.Result{}, err
		}
	}
	if !known {
		return strategy.BadRequest(strategy.UnknownSKU(req.SKU))
	}
	if _, out := n.c.soldOut.Load(req.SKU); out {
		if n.c.breaks != soldOutPerProcess {
			return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
		}
		existing, err := n.c.lookupIn(ctx, n.c.db, req.Key)
		if err != nil {
			return strategy.Result{}, err
		}
		if existing.Status != strategy.StatusNotFound {
			return n.c.knownKey(req, existing), nil
		}
		var holds bool
		if err := n.c.db.QueryRow(ctx, n.c.t.q(`SELECT EXISTS (SELECT 1 FROM {reservation} WHERE sku = $1 AND user_id = $2 AND status IN ('HELD','CONFIRMED'))`), req.SKU, req.User).Scan(&holds); err != nil {
			return strategy.Result{}, err
		}
		if holds {
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
		}
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	}
	if _, failed := n.c.failed.Load(req.Key); failed {
		if r, err := n.c.lookupIn(ctx, n.c.db, req.Key); err == nil && r.Status == strategy.StatusNotFound {
			if n.c.breaks == resendUnsureThenReplay {
				if _, again := n.c.resent.LoadOrStore(req.Key, true); !again {
					return strategy.Result{}, fmt.Errorf("ctl: resend of %q: %w", req.Key, context.DeadlineExceeded)
				}
				return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: strategy.Reservation{Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld}}, nil
			}
			return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
		}
	}
	var res strategy.Result
	err := pgx.BeginFunc(ctx, n.c.db, func(tx pgx.Tx) error {
		if n.c.breaks == asyncCommit {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
				return err
			}
		}
		if n.c.breaks == lockTimeoutSoldOut {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '500ms'`); err != nil {
				return err
			}
		}
		if n.c.breaks == lockTimeoutLongSoldOut {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '15s'`); err != nil {
				return err
			}
		}
		if n.c.breaks == lockTimeoutUserLimit {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
				return err
			}
		}
		var err error
		res, err = n.c.reserveIn(ctx, tx, req)
		return err
	})
	if err != nil && (n.c.breaks == resendAfterErrorSoldOut || n.c.breaks == resendUnsureThenReplay) {
		n.c.failed.Store(req.Key, true)
	}
	if err != nil && n.c.breaks == errorIsSoldOut {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" && (n.c.breaks == lockTimeoutSoldOut || n.c.breaks == lockTimeoutLongSoldOut) {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil // "the row is busy, so it must be gone"
	}
	if err != nil && n.c.breaks == cancelIsBusy && errors.Is(err, context.Canceled) {
		return strategy.Result{Outcome: strategy.OutcomeBusy}, nil // "the caller left before anything was decided"
	}
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" && n.c.breaks == lockTimeoutUserLimit {
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil // "the index it waited on is the user's"
	}
	if n.c.breaks == deadlineSoldOut && errors.Is(err, context.DeadlineExceeded) && outer.Err() == nil {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	}
	if err == nil && res.Outcome == strategy.OutcomeSoldOut && (n.c.breaks == soldOutFirst || n.c.breaks == soldOutPerProcess) {
		n.c.soldOut.Store(req.SKU, true)
	}
	return res, err
}

func (c *control) knownKey(req strategy.Request, existing strategy.Reservation) strategy.Result {
	ended := existing.Status == strategy.StatusReleased || existing.Status == strategy.StatusExpired
	sameSKU := existing.SKU == req.SKU || c.breaks == replaySKUFolded && strings.EqualFold(existing.SKU, req.SKU)
	if (existing.User != req.User || !sameSKU) && !(c.breaks == endedKeyReplays && ended) {
		return strategy.Result{Outcome: strategy.OutcomeKeyReused, Reservation: existing}
	}
	if c.breaks == replayIsHeld {
		return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: existing}
	}
	return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: existing}
}

// reserveIn is strategy A's reservation (savepoint, insert the key, take
// the unit) with the control's mistake, if it is in this path.
func (c *control) reserveIn(ctx context.Context, tx pgx.Tx, req strategy.Request) (strategy.Result, error) {
	if c.breaks == endedKeySoldOut {
		var active, unitLeft bool
		if err := tx.QueryRow(ctx, c.t.q(`SELECT EXISTS (SELECT 1 FROM {reservation} WHERE request_key = $1 AND status IN ('HELD','CONFIRMED')),
			EXISTS (SELECT 1 FROM {stock} WHERE sku = $2 AND available > 0)`), req.Key, req.SKU).Scan(&active, &unitLeft); err != nil {
			return strategy.Result{}, err
		}
		if !active && !unitLeft {
			return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
		}
	}
	if c.breaks == cartCap {
		var n int
		if err := tx.QueryRow(ctx, c.t.q(`SELECT count(*) FROM {reservation} WHERE user_id = $1 AND request_key <> $2 AND status IN ('HELD','CONFIRMED')`),
			req.User, req.Key).Scan(&n); err != nil {
			return strategy.Result{}, err
		}
		if n >= 10 {
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
		}
	}
	if c.breaks == limitBeforeKey {
		var has bool
		if err := tx.QueryRow(ctx, c.t.q(`SELECT EXISTS (SELECT 1 FROM {reservation} WHERE sku = $1 AND user_id = $2 AND request_key <> $3 AND status IN ('HELD','CONFIRMED'))`),
			req.SKU, req.User, req.Key).Scan(&has); err != nil {
			return strategy.Result{}, err
		}
		if has {
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
		}
	}
	if c.breaks == limitSkipsDue {
		existing, err := c.replayIn(ctx, tx, req.Key)
		if err != nil {
			return strategy.Result{}, err
		}
		if existing.Status == strategy.StatusNotFound {
			// The stock row's lock first: the SELECT below then runs one
			// at a time per SKU, so only the due rows it skips are wrong.
			if _, err := tx.Exec(ctx, c.t.q(`SELECT 1 FROM {stock} WHERE sku = $1 FOR UPDATE`), req.SKU); err != nil {
				return strategy.Result{}, err
			}
			var has bool
			if err := tx.QueryRow(ctx, c.t.q(`SELECT EXISTS (SELECT 1 FROM {reservation} WHERE sku = $1 AND user_id = $2
				AND (status = 'CONFIRMED' OR status = 'HELD' AND expires_at >= now()))`), req.SKU, req.User).Scan(&has); err != nil {
				return strategy.Result{}, err
			}
			if has {
				return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
			}
		}
	}
	if c.breaks == checkThenInsert {
		var has bool
		if err := tx.QueryRow(ctx, c.t.q(`SELECT EXISTS (SELECT 1 FROM {reservation} WHERE sku = $1 AND user_id = $2 AND status IN ('HELD','CONFIRMED'))`),
			req.SKU, req.User).Scan(&has); err != nil {
			return strategy.Result{}, err
		}
		if has {
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
		}
	}
	if c.breaks == keyNotUnique || c.breaks == keyPerSKU {
		existing, err := c.replayIn(ctx, tx, req.Key)
		if err != nil {
			return strategy.Result{}, err
		}
		if existing.Status != strategy.StatusNotFound {
			return c.knownKey(req, existing), nil
		}
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return strategy.Result{}, err
	}
	var expires time.Time
	insert := `INSERT INTO {reservation} (request_key, user_id, sku, status, expires_at)
		VALUES ($1, $2, $3, 'HELD', now() + $4::interval)
		ON CONFLICT (request_key) DO NOTHING RETURNING expires_at`
	switch c.breaks {
	case keyNotUnique:
		insert = `INSERT INTO {reservation} (request_key, user_id, sku, status, expires_at)
		VALUES ($1, $2, $3, 'HELD', now() + $4::interval) RETURNING expires_at`
	case keyPerSKU:
		insert = strings.Replace(insert, "ON CONFLICT (request_key)", "ON CONFLICT (sku, request_key)", 1)
	case keyCaseFolded:
		insert = strings.Replace(insert, "ON CONFLICT (request_key)", "ON CONFLICT (lower(request_key))", 1)
	case keyPrefix64:
		insert = strings.Replace(insert, "ON CONFLICT (request_key)", "ON CONFLICT (left(request_key, 64))", 1)
	case ttlCapped:
		insert = strings.Replace(insert, "now() + $4::interval", "now() + least($4::interval, interval '1 hour')", 1)
	case ttlJustified:
		insert = strings.Replace(insert, "now() + $4::interval", "now() + justify_hours($4::interval)", 1)
	}
	var ttl any = req.TTL
	switch c.breaks {
	case ttlWrongUnit:
		insert = strings.Replace(insert, "$4::interval", "make_interval(secs => $4::bigint)", 1)
		ttl = req.TTL.Milliseconds()
	case ttlWholeSeconds:
		insert = strings.Replace(insert, "$4::interval", "make_interval(secs => $4::bigint)", 1)
		ttl = int64(req.TTL.Seconds())
	case ttlRoundedMillis:
		ttl = req.TTL.Round(time.Millisecond)
	}
	args := []any{req.Key, req.User, req.SKU, ttl}
	if c.breaks == sessionStampsByAppClock && ctx.Value(inSession{}) != nil {
		insert = strings.Replace(insert, "now() + $4::interval", "$5::timestamptz + $4::interval", 1)
		args = append(args, time.Now())
	}
	err = sp.QueryRow(ctx, c.t.q(insert), args...).Scan(&expires)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "23505" && c.breaks == uniqueViolationIsLimit:
		_ = sp.Rollback(ctx)
		return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "23505":
		_ = sp.Rollback(ctx)
		existing, lerr := c.replayIn(ctx, tx, req.Key)
		switch {
		case lerr != nil:
			return strategy.Result{}, lerr
		case existing.Status == strategy.StatusNotFound:
			return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
		}
		if c.breaks == replayExtendsHold && existing.User == req.User && existing.SKU == req.SKU && existing.Status == strategy.StatusHeld {
			if err := tx.QueryRow(ctx, c.t.q(`UPDATE {reservation} SET expires_at = now() + $2::interval WHERE request_key = $1 RETURNING expires_at`),
				req.Key, req.TTL).Scan(&existing.ExpiresAt); err != nil {
				return strategy.Result{}, err
			}
		}
		return c.knownKey(req, existing), nil
	case err != nil:
		return strategy.Result{}, err
	}
	took, err := c.takeUnit(ctx, sp, req.SKU)
	if err != nil {
		return strategy.Result{}, err
	}
	if !took {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, sp.Rollback(ctx)
	}
	if err := sp.Commit(ctx); err != nil {
		return strategy.Result{}, err
	}
	if c.breaks == answerExpiresByAppClock {
		expires = time.Now().Add(req.TTL)
	}
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: strategy.Reservation{
		Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: expires}}, nil
}

// takeUnit decrements the stock row and reports whether a unit was taken.
func (c *control) takeUnit(ctx context.Context, tx pgx.Tx, sku string) (bool, error) {
	switch c.breaks {
	case unconditionalDecrement:
		_, err := tx.Exec(ctx, c.t.q(`UPDATE {stock} SET available = available - 1 WHERE sku = $1`), sku)
		return err == nil, err
	case lazyExpiryCount:
		tag, err := tx.Exec(ctx, c.t.q(`UPDATE {stock} SET available = available - 1 WHERE sku = $1
			AND available + (SELECT count(*) FROM {reservation} WHERE sku = $1 AND status = 'HELD' AND expires_at < now()) > 0`), sku)
		return err == nil && tag.RowsAffected() == 1, err
	case lostUpdate:
		var avail int
		if err := tx.QueryRow(ctx, c.t.q(`SELECT available FROM {stock} WHERE sku = $1`), sku).Scan(&avail); err != nil {
			return false, err
		}
		if avail <= 0 {
			return false, nil
		}
		_, err := tx.Exec(ctx, c.t.q(`UPDATE {stock} SET available = $2 WHERE sku = $1`), sku, avail-1)
		return err == nil, err
	case soldOutWhenLocked:
		var avail int
		err := tx.QueryRow(ctx, c.t.q(`SELECT available FROM {stock} WHERE sku = $1 FOR NO KEY UPDATE NOWAIT`), sku).Scan(&avail)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return false, nil // the row is locked: "sold out"
		}
		if err != nil {
			return false, err
		}
	}
	tag, err := tx.Exec(ctx, c.t.q(`UPDATE {stock} SET available = available - 1 WHERE sku = $1 AND available > 0`), sku)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

func (n *node) Confirm(ctx context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if err := n.check(); err != nil {
		return false, err
	}
	if !n.c.storable(key) {
		return false, nil
	}
	status := `AND status = 'HELD'`
	switch n.c.breaks {
	case confirmNoStatusCheck:
		status = ``
	case confirmAgain:
		status = `AND status IN ('HELD', 'CONFIRMED')`
	}
	switch {
	case mode == strategy.ConfirmUntilExpired && n.c.breaks == lateConfirmWindow:
		status += ` AND expires_at >= now() - interval '10 minutes'`
	case mode != strategy.ConfirmBeforeExpiry || n.c.breaks == confirmIgnoresExpiry:
	case n.c.breaks == confirmEarly:
		status += ` AND expires_at >= now() + interval '2 seconds'`
	case n.c.breaks == confirmByAppClock:
		status += ` AND expires_at >= $3::timestamptz`
	case n.c.breaks == confirmSkew:
		status += ` AND expires_at >= now() + interval '50 milliseconds'`
	case n.c.breaks == confirmGrace:
		status += ` AND expires_at >= now() - interval '500 milliseconds'`
	default:
		status += ` AND expires_at >= now()`
	}
	where := `request_key = $1`
	if n.c.breaks == confirmSkipLocked {
		where = `request_key = (SELECT request_key FROM {reservation} WHERE request_key = $1 FOR UPDATE SKIP LOCKED)`
	}
	if n.c.breaks == confirmCart {
		where = `user_id = (SELECT user_id FROM {reservation} WHERE request_key = $1 AND sku = ANY($2) AND status = 'HELD')`
	}
	args := []any{key, n.c.skus}
	if strings.Contains(status, "$3") {
		args = append(args, time.Now()) // confirmByAppClock
	}
	tag, err := n.c.db.Exec(ctx, n.c.t.q(`UPDATE {reservation} SET status = 'CONFIRMED' WHERE `+where+` AND sku = ANY($2) `+status), args...)
	if n.c.breaks == confirmCart && tag.RowsAffected() > 1 {
		return true, err // the key's own row was among them
	}
	if tag.RowsAffected() == 1 {
		n.own.Delete(key) // lookupCachesOwn: forgets only what it moved
	}
	return tag.RowsAffected() == 1, err
}

func (n *node) Release(ctx context.Context, key string) (int, error) {
	if err := n.check(); err != nil {
		return 0, err
	}
	if !n.c.storable(key) {
		return 0, nil
	}
	n.forgetSold(key) // limitCacheNode: only this node forgets
	status := `AND status = 'HELD'`
	switch n.c.breaks {
	case releaseNoStatusCheck:
		status = ``
	case releaseReadThenMove:
		var was string
		err := n.c.db.QueryRow(ctx, n.c.t.q(`SELECT status FROM {reservation} WHERE request_key = $1 AND sku = ANY($2)`), key, n.c.skus).Scan(&was)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && was != string(strategy.StatusHeld) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		status = `AND status <> 'RELEASED'`
	case releaseRefusesDue:
		status = `AND status = 'HELD' AND expires_at >= now()`
	case releaseConfirmed:
		status = `AND status IN ('HELD', 'CONFIRMED')`
	case releaseExpired:
		status = `AND status IN ('HELD', 'EXPIRED')`
	}
	back := `UPDATE {stock} s SET available = s.available + 1 FROM moved WHERE s.sku = moved.sku RETURNING 1`
	switch n.c.breaks {
	case releaseKeepsUnit:
		back = `SELECT 1 FROM moved`
	case releaseEverySKU:
		back = `UPDATE {stock} s SET available = s.available + 1 WHERE s.sku = ANY($2) AND EXISTS (SELECT 1 FROM moved) RETURNING 1`
	}
	var units int
	var skus any = n.c.skus
	inSKUs := `sku = ANY($2)`
	if n.c.breaks == skusAsCSV {
		skus, inSKUs = strings.Join(n.c.skus, ","), `sku = ANY(string_to_array($2::text, ','))`
	}
	release := n.c.t.q(`
		WITH moved AS (
			UPDATE {reservation} SET status = 'RELEASED' WHERE request_key = $1 AND ` + inSKUs + ` ` + status + ` RETURNING sku),
		back AS (` + back + `)
		SELECT count(*)::int FROM back`)
	if n.c.breaks == releaseStampsNow {
		release = strings.Replace(release, "SET status = 'RELEASED'", "SET status = 'RELEASED', expires_at = now()", 1)
	}
	var err error
	if n.c.breaks == releaseRefusedZero {
		err = pgx.BeginTxFunc(ctx, n.c.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, release, key, skus).Scan(&units)
		})
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40001" {
			return 0, nil
		}
	} else if n.c.breaks == releaseLeaksTx {
		var tx pgx.Tx
		if tx, err = n.c.db.Begin(ctx); err != nil {
			return 0, err
		}
		if err = tx.QueryRow(ctx, release, key, skus).Scan(&units); err != nil {
			return 0, err // the mistake: the transaction is never ended
		}
		if units == 0 {
			return 0, nil // the mistake: "nothing to commit"
		}
		err = tx.Commit(ctx)
	} else if n.c.breaks == releaseLeaksConn {
		var conn *pgxpool.Conn
		if conn, err = n.c.db.Acquire(ctx); err != nil {
			return 0, err
		}
		if err = conn.QueryRow(ctx, release, key, skus).Scan(&units); err != nil {
			return 0, err // the mistake: the connection is never released
		}
		conn.Release()
	} else {
		err = n.c.db.QueryRow(ctx, release, key, skus).Scan(&units)
	}
	if err != nil && (n.c.breaks == releaseErrorZero || n.c.breaks == releaseDeadlineZero && errors.Is(err, context.DeadlineExceeded)) {
		return 0, nil
	}
	if units > 0 {
		n.c.soldOut.Clear() // soldOutFirst: a unit came back
		n.own.Delete(key)   // lookupCachesOwn: forgets only what it moved
	}
	return units, err
}

func (n *node) ExpireDue(ctx context.Context) (int, error) {
	if err := n.check(); err != nil {
		return 0, err
	}
	n.own.Clear()
	if n.c.breaks == expireRetryCounts {
		return n.c.expireRetrying(ctx)
	}
	var units int
	err := pgx.BeginFunc(ctx, n.c.db, func(tx pgx.Tx) error {
		var err error
		units, err = n.c.expireIn(ctx, tx, true)
		return err
	})
	if err != nil && n.c.breaks == expireGiveUpZero && ctx.Err() != nil {
		return 0, nil
	}
	if units > 0 {
		n.c.soldOut.Clear() // soldOutFirst: a unit came back
	}
	return units, err
}

// expireIn runs the expiry job in tx. The split control commits its stock
// return on its own, outside tx: that is its mistake. In process, its first
// run dies between the two (simulateDeath); in the kill-release scenario a
// real SIGKILL does it.
func (c *control) expireIn(ctx context.Context, tx pgx.Tx, simulateDeath bool) (int, error) {
	if c.breaks == expirySessionAsync {
		if _, err := tx.Exec(ctx, `SET synchronous_commit = off`); err != nil {
			return 0, err
		}
	}
	if c.breaks == purgeEnded {
		if _, err := tx.Exec(ctx, c.t.q(`DELETE FROM {reservation} WHERE sku = ANY($1) AND status IN ('RELEASED','EXPIRED') AND expires_at < now() - interval '7 days'`), c.skus); err != nil {
			return 0, err
		}
	}
	switch c.breaks {
	case releaseWithoutStatusCheck:
		ids, err := c.dueIDs(ctx, tx, `sku = ANY($1) AND expires_at < now()`)
		if err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, c.t.q(`UPDATE {reservation} SET status = 'EXPIRED' WHERE reservation_id = ANY($1)`), ids); err != nil {
			return 0, err
		}
		return len(ids), c.giveBack(ctx, tx, ids)
	case expireByIDsRead:
		ids, err := c.dueIDs(ctx, tx, `sku = ANY($1) AND status = 'HELD' AND expires_at < now()`)
		if err != nil {
			return 0, err
		}
		rows, err := tx.Query(ctx, c.t.q(`UPDATE {reservation} SET status = 'EXPIRED' WHERE reservation_id = ANY($1) RETURNING reservation_id`), ids)
		if err != nil {
			return 0, err
		}
		moved, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return 0, err
		}
		return len(moved), c.giveBack(ctx, tx, moved)
	case expireCountsRead:
		ids, err := c.dueIDs(ctx, tx, `sku = ANY($1) AND status = 'HELD' AND expires_at < now()`)
		if err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, c.t.q(`UPDATE {reservation} SET status = 'EXPIRED' WHERE reservation_id = ANY($1) AND status = 'HELD'`), ids); err != nil {
			return 0, err
		}
		return len(ids), c.giveBack(ctx, tx, ids)
	case splitRelease:
		var ids []int64
		err := pgx.BeginFunc(ctx, c.db, func(first pgx.Tx) error {
			var err error
			if ids, err = c.dueIDs(ctx, first, `sku = ANY($1) AND status = 'HELD' AND expires_at < now()`); err != nil {
				return err
			}
			return c.giveBack(ctx, first, ids)
		})
		if err != nil {
			return 0, err
		}
		if simulateDeath && len(ids) > 0 && c.firstRunDied.CompareAndSwap(false, true) {
			return 0, errors.New("release job killed between its two transactions (simulated)")
		}
		_, err = tx.Exec(ctx, c.t.q(`UPDATE {reservation} SET status = 'EXPIRED' WHERE reservation_id = ANY($1)`), ids)
		return len(ids), err
	}
	statuses := `'HELD'`
	if c.breaks == expireConfirmed {
		statuses = `'HELD', 'CONFIRMED'`
	}
	scope := `sku = ANY($1)`
	// simulateDeath is set on the plain job's path only: the job held open
	// (session.ExpireDue) is the one without it.
	if c.breaks == expireEverySKU || (c.breaks == expireHeldOpenEverySKU && !simulateDeath) {
		scope = `$1::text[] IS NOT NULL`
	}
	due := `now()`
	switch c.breaks {
	case expireEarly:
		due = `now() + interval '2 seconds'`
	case expireSkew:
		due = `now() + interval '50 milliseconds'`
	case expireLag:
		due = `now() - interval '500 milliseconds'`
	case expireByAppClock:
		due = `$2::timestamptz`
	}
	appClock := c.breaks == expireByAppClock || c.breaks == heldJobByAppClock && ctx.Value(inSession{}) != nil
	if appClock {
		due = `$2::timestamptz`
	}
	args := []any{c.skus}
	if appClock {
		args = append(args, time.Now())
	}
	batch := ""
	if c.breaks == expireWindow {
		batch = ` AND expires_at > now() - interval '6 hours'`
	}
	if c.breaks == expireSomeSKUs {
		batch = ` AND sku = ANY(ARRAY(SELECT DISTINCT sku FROM {reservation} WHERE ` + scope + ` AND status IN (` + statuses + `) AND expires_at < ` + due + ` ORDER BY sku LIMIT 32))`
	}
	if c.breaks == expireInBatches {
		batch = ` AND reservation_id IN (SELECT reservation_id FROM {reservation} WHERE ` + scope + ` AND status IN (` + statuses + `) AND expires_at < ` + due + ` ORDER BY expires_at LIMIT 1000)`
	}
	var units int
	err := tx.QueryRow(ctx, c.t.q(`
		WITH moved AS (
			UPDATE {reservation} SET status = 'EXPIRED'
			WHERE `+scope+` AND status IN (`+statuses+`) AND expires_at < `+due+batch+` RETURNING sku),
		per AS (SELECT sku, count(*) AS n FROM moved GROUP BY sku),
		upd AS (UPDATE {stock} s SET available = s.available + per.n FROM per WHERE s.sku = per.sku RETURNING per.n)
		SELECT coalesce(sum(n), 0) FROM upd`), args...).Scan(&units)
	return units, err
}

// expireRetrying is expireRetryCounts's ExpireDue.
func (c *control) expireRetrying(ctx context.Context) (int, error) {
	units := 0 // the mistake: counted across tries
	for try := 0; ; try++ {
		err := pgx.BeginTxFunc(ctx, c.db, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
			ids, err := c.dueIDs(ctx, tx, `sku = ANY($1) AND status = 'HELD' AND expires_at < now()`)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, c.t.q(`UPDATE {reservation} SET status = 'EXPIRED' WHERE reservation_id = ANY($1)`), ids); err != nil {
				return err
			}
			units += len(ids)
			return c.giveBack(ctx, tx, ids)
		})
		var pgErr *pgconn.PgError
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "40001" && try < 10 {
			continue
		}
		if units > 0 {
			c.soldOut.Clear()
		}
		return units, err
	}
}

func (c *control) dueIDs(ctx context.Context, tx pgx.Tx, where string) ([]int64, error) {
	rows, err := tx.Query(ctx, c.t.q(`SELECT reservation_id FROM {reservation} WHERE `+where), c.skus)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// giveBack returns one unit per id read, per SKU: the count comes from the
// list, not from rows a transition moved.
func (c *control) giveBack(ctx context.Context, tx pgx.Tx, ids []int64) error {
	_, err := tx.Exec(ctx, c.t.q(`
		UPDATE {stock} s SET available = s.available + per.n
		FROM (SELECT sku, count(*) AS n FROM {reservation} WHERE reservation_id = ANY($1) GROUP BY sku) per
		WHERE s.sku = per.sku`), ids)
	return err
}
