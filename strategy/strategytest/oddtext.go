package strategytest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// oddText is valid text that a strategy must store and find as sent: SQL
// and LIKE metacharacters, a backslash, Redis key separators and hash-tag
// braces, whitespace, and characters outside ASCII (what a key built into a
// statement with Sprintf, a LIKE where = was meant, or a column of the
// wrong type or width gets wrong).
const oddText = `'"; --%_\ {x}:*? é 中 😀`

// fill pads s with '.' to exactly n bytes (s is shorter).
func fill(s string, n int) string { return s + strings.Repeat(".", n-len(s)) }

// checkOddText: every valid request is stored and found exactly as sent.
// The scenarios send keys, users and SKUs of a few ASCII letters, digits
// and dashes, so a strategy that builds a statement or a Redis key by
// pasting the text in, matches it with LIKE, or stores it in a column
// narrower than the contract's lengths passes them all. Here a deployment
// whose SKUs are odd text, one of them MaxSKULen bytes long, takes
// requests whose keys and users are odd text, and the longest the contract
// allows (MaxKeyLen, MaxUserLen): each must be HELD, found by Lookup with
// the same key, user and SKU, answered REPLAY when sent again, and
// released when the strategy releases.
func checkOddText(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := kitSKU("odd")
	skus := []string{base + " " + oddText, fill(base+oddText, strategy.MaxSKULen)}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: skus[0], Total: 3}, {SKU: skus[1], Total: 1}}})
	if err != nil {
		t.Fatalf("Open with SKUs %q and %q: %v", skus[0], skus[1], err)
	}
	defer dep.Close()
	node := dep.Node(0)
	reqs := []strategy.Request{
		{Key: "kit-" + oddText + " " + base, User: "kit-odd-user-1", SKU: skus[0]},
		{Key: "kit-odd-key-2 " + base, User: "kit-" + oddText, SKU: skus[0]},
		{Key: fill("kit-longest-"+base+oddText, strategy.MaxKeyLen), User: fill("kit-longest-"+oddText, strategy.MaxUserLen), SKU: skus[0]},
		{Key: "kit-odd-key-4 " + base, User: "kit-odd-user-4", SKU: skus[1]},
	}
	releaser, canRelease := node.(strategy.Releaser)
	active := map[string]int{}
	for _, req := range reqs {
		req.TTL = time.Hour
		res, err := reserveUnlessBusy(ctx, node, req)
		if err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Errorf("Reserve key %q, user %q, sku %q: %s, %v; want HELD", req.Key, req.User, req.SKU, res.Outcome, err)
			continue
		}
		active[req.SKU]++
		if r := res.Reservation; r.Key != req.Key || r.User != req.User || r.SKU != req.SKU {
			t.Errorf("Reserve key %q: the answer carries key %q, user %q, sku %q; want the request's", req.Key, r.Key, r.User, r.SKU)
		}
		got, err := node.Lookup(ctx, req.Key)
		if err != nil || got.Status != strategy.StatusHeld || got.Key != req.Key || got.User != req.User || got.SKU != req.SKU {
			t.Errorf("Lookup of key %q after HELD: %+v, %v; want it HELD with the request's user %q and sku %q", req.Key, got, err, req.User, req.SKU)
		}
		if again, err := reserveUnlessBusy(ctx, node, req); err != nil || again.Outcome != strategy.OutcomeReplay {
			t.Errorf("Reserve key %q again: %s, %v; want REPLAY", req.Key, again.Outcome, err)
		}
		if canRelease {
			units, err := releaser.Release(ctx, req.Key)
			if err != nil || units != 1 {
				t.Errorf("Release of key %q: %d units, %v; want 1", req.Key, units, err)
			} else {
				active[req.SKU]--
			}
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	total := map[string]int{skus[0]: 3, skus[1]: 1}
	for _, a := range list {
		if a.Total != total[a.SKU] || a.Active != active[a.SKU] || a.Drift() != 0 {
			t.Errorf("Audit of sku %q: total %d, available %d, active %d; want total %d, active %d, drift 0", a.SKU, a.Total, a.Available, a.Active, total[a.SKU], active[a.SKU])
		}
	}
	if len(list) != len(total) {
		t.Errorf("Audit: %d rows; want one per SKU (%d)", len(list), len(total))
	}
}

// checkDistinctText: texts that differ only in letter case, in a trailing
// space, in Unicode normal form, in width, or as aliases of one e-mail
// inbox are different keys, users and SKUs, as
// the contract compares them (byte for byte). A strategy that folds case
// (a unique index on lower(key)), trims, or normalizes answers the second
// of such keys REPLAY or KEY_REUSED, refuses the second such user
// USER_LIMIT, or cannot open the second such SKU. Here a deployment opens
// two SKUs that differ only in case; on each, requests whose keys and
// users differ only so must each be HELD and found by Lookup as their own;
// then a key sent again by a user that differs from its owner only so, or
// by its owner for a SKU that differs from its own only so, must be
// KEY_REUSED, and a SKU that differs from the deployment's only in case or
// by a leading space is a bad request.
func checkDistinctText(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := kitSKU("case")
	skus := []string{base + "-Case", base + "-case", base + "-case "}
	// ASCII letters in both cases (what lower() folds in any locale), a
	// trailing space, é in both cases, precomposed and combined.
	// And the full-width form of one of them (users: checkLookalikeKeys
	// has the keys).
	// And e-mail addresses that one inbox receives (case, a +tag, Gmail's
	// dots): users that an "anti-scalping" canonical form would make one.
	variants := []string{"Order-A", "order-a", "order-a ", "order-É", "order-é", "order-e\u0301", fullWidth("order-a"),
		"Jane.Doe+a@Gmail.com", "janedoe@gmail.com", "jane.doe+b@gmail.com", "JaneDoe@googlemail.com"}
	var stock []strategy.Stock
	for _, sku := range skus {
		stock = append(stock, strategy.Stock{SKU: sku, Total: len(variants)})
	}
	stock[0].Total += len(lookalikes) + len(uuidLookalikes) // checkLookalikeKeys's
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open with SKUs %q, %q and %q (they differ only in case or a trailing space): %v", skus[0], skus[1], skus[2], err)
	}
	defer dep.Close()
	node := dep.Node(0)
	checkLookalikeKeys(ctx, t, node, skus[0])
	for si, sku := range skus {
		for _, v := range variants {
			req := strategy.Request{Key: fmt.Sprintf("kit-%s-%d-%s", v, si, base), User: "kit-user-" + v, SKU: sku, TTL: time.Hour}
			res, err := reserveUnlessBusy(ctx, node, req)
			if err != nil || res.Outcome != strategy.OutcomeHeld {
				t.Errorf("Reserve key %q, user %q, sku %q (keys, users and SKUs that differ only in case, a trailing space, normal form, width or as e-mail aliases are different): %s, %v; want HELD",
					req.Key, req.User, req.SKU, res.Outcome, err)
				continue
			}
			got, err := node.Lookup(ctx, req.Key)
			if err != nil || got.Key != req.Key || got.User != req.User || got.SKU != req.SKU {
				t.Errorf("Lookup of key %q: %+v, %v; want its own reservation (user %q, sku %q)", req.Key, got, err, req.User, req.SKU)
			}
		}
	}
	// A known key sent again by a user that differs from its own only so
	// is another user's: KEY_REUSED, not the owner's REPLAY (outsider
	// round 41: users compared with strings.EqualFold on that path alone).
	for _, pair := range foldedUsers {
		key := fmt.Sprintf("kit-%s-%d-%s", variants[pair[0]], 0, base)
		req := strategy.Request{Key: key, User: "kit-user-" + variants[pair[1]], SKU: skus[0], TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, node, req); err != nil || res.Outcome != strategy.OutcomeKeyReused {
			t.Errorf("Reserve key %q again, by user %q (it was held by %q; users that differ only in case, a trailing space, normal form, width or as e-mail aliases are different): %s, %v; want KEY_REUSED",
				req.Key, req.User, "kit-user-"+variants[pair[0]], res.Outcome, err)
		}
	}
	// A known key sent again by its own user for a SKU whose name differs
	// from its own only so is a request for another SKU: KEY_REUSED, not
	// REPLAY (outsider rounds 47 and 48: the known key's SKU compared with
	// strings.EqualFold). And a SKU that differs from the deployment's
	// only in case, or by a leading space, is not the deployment's: a bad
	// request, however the strategy folds the names it checks against.
	for si := range skus {
		key := fmt.Sprintf("kit-%s-%d-%s", variants[0], si, base)
		other := skus[(si+1)%len(skus)]
		req := strategy.Request{Key: key, User: "kit-user-" + variants[0], SKU: other, TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, node, req); err != nil || res.Outcome != strategy.OutcomeKeyReused {
			t.Errorf("Reserve key %q again, by its user, for sku %q (it was held for %q; SKUs that differ only in case or a trailing space are different): %s, %v; want KEY_REUSED",
				req.Key, other, skus[si], res.Outcome, err)
		}
	}
	// Another deployment sells them, so a strategy that folds its own
	// SKUs finds stock to sell (outsider round 47's m03 sold that
	// deployment's unit; with no stock anywhere, a foreign key refused it).
	others := []string{strings.ToUpper(skus[0]), " " + skus[0]}
	other, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: others[0], Total: 1}, {SKU: others[1], Total: 1}}})
	if err != nil {
		t.Fatalf("Open of another deployment with SKUs %q and %q: %v", others[0], others[1], err)
	}
	defer other.Close()
	for i, sku := range others {
		req := strategy.Request{Key: fmt.Sprintf("kit-other-sku-%d-%s", i, base), User: "kit-user-other-sku", SKU: sku, TTL: time.Hour}
		res, err := node.Reserve(ctx, req)
		var rerr *strategy.RequestError
		if res.Outcome != strategy.OutcomeBadRequest || !errors.As(err, &rerr) || rerr.Field != "sku" {
			t.Errorf("Reserve for sku %q, another deployment's (this one's %q differs from it only in case or a leading space): %s, %v; want BAD_REQUEST naming the sku",
				sku, skus[0], res.Outcome, err)
		}
	}
	if list, err := other.Audit(ctx); err != nil {
		t.Fatalf("Audit of the other deployment: %v", err)
	} else {
		for _, a := range list {
			if a.Available != a.Total || a.Active != 0 {
				t.Errorf("Audit of the other deployment's sku %q: total %d, available %d, active %d; want nothing sold (requests for it went to a deployment that does not sell it)", a.SKU, a.Total, a.Available, a.Active)
			}
		}
	}
	// Every SKU is sold out now. A strategy that reads why a request was
	// refused in a statement of its own may fold case there alone, where
	// the unique indexes stay exact: a new key of a user that differs from
	// a holder only in case, and a new key that differs from a known one
	// only in case, are SOLD_OUT, not USER_LIMIT or KEY_REUSED (outsider
	// round 46's m23 and m24: a refused request was only ever a known key).
	// The same for a holder's user or a known key with spaces around it,
	// or with LIKE's `_` or `%` in place of some of it (round 55's m22,
	// m31, m32: the reading trimmed the user, or compared with LIKE), and
	// inside an attempt held open, whose refusals a strategy may explain
	// with a reading of its own (round 55's m35).
	known := fmt.Sprintf("kit-%s-%d-%s", variants[0], 0, base) // held by kit-user-Order-A
	soldOut := []strategy.Request{
		{Key: "kit-sold-out-" + base, User: "kit-user-ORDER-A"},
		{Key: strings.ToUpper(known), User: "kit-user-sold-out"},
		{Key: "kit-sold-out-lead-" + base, User: " kit-user-Order-A"},
		{Key: "kit-sold-out-trail-" + base, User: "kit-user-Order-A  "},
		{Key: "kit-sold-out-under-" + base, User: "kit-user-Order_A"},
		{Key: "kit-sold-out-percent-" + base, User: "kit-user-Order-%"},
		{Key: known + "  ", User: "kit-user-sold-out"},
		{Key: " " + known, User: "kit-user-sold-out"},
		{Key: strings.Replace(known, "Order-A", "Order_A", 1), User: "kit-user-sold-out"},
		{Key: strings.TrimSuffix(known, base) + "%", User: "kit-user-sold-out"},
	}
	for i := range soldOut {
		soldOut[i].SKU, soldOut[i].TTL = skus[0], time.Hour
	}
	for _, req := range soldOut {
		if res, err := reserveUnlessBusy(ctx, node, req); err != nil || res.Outcome != strategy.OutcomeSoldOut {
			t.Errorf("Reserve key %q, user %q on sold-out sku %q (a holder's user or a known key differs from them only in case, spaces around it, or as a LIKE pattern: different): %s (reservation %q), %v; want SOLD_OUT",
				req.Key, req.User, req.SKU, res.Outcome, res.Reservation.Key, err)
		}
	}
	if opener, ok := node.(strategy.SessionOpener); ok {
		for _, req := range soldOut {
			s, err := opener.OpenSession(ctx)
			if err != nil {
				t.Fatalf("OpenSession: %v", err)
			}
			res, err := s.Reserve(ctx, req)
			_ = s.Rollback(ctx)
			if err != nil || res.Outcome != strategy.OutcomeSoldOut {
				t.Errorf("in an attempt held open, Reserve key %q, user %q on sold-out sku %q (a holder's user or a known key differs from them only in case, spaces around it, or as a LIKE pattern: different): %s (reservation %q), %v; want SOLD_OUT",
					req.Key, req.User, req.SKU, res.Outcome, res.Reservation.Key, err)
			}
		}
		// A known key sent by its own user for another SKU, inside an
		// attempt: KEY_REUSED, as on the plain path (round 55's m38 answered
		// REPLAY there).
		s, err := opener.OpenSession(ctx)
		if err != nil {
			t.Fatalf("OpenSession: %v", err)
		}
		req := strategy.Request{Key: known, User: "kit-user-" + variants[0], SKU: skus[1], TTL: time.Hour}
		res, err := s.Reserve(ctx, req)
		_ = s.Rollback(ctx)
		if err != nil || res.Outcome != strategy.OutcomeKeyReused || res.Reservation.SKU != skus[0] {
			t.Errorf("in an attempt held open, Reserve key %q again, by its user, for sku %q (it was held for %q): %s (reservation of sku %q), %v; want KEY_REUSED with the reservation it names",
				req.Key, req.SKU, skus[0], res.Outcome, res.Reservation.SKU, err)
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, a := range list {
		if a.Active != a.Total || a.Drift() != 0 {
			t.Errorf("Audit of sku %q: total %d, available %d, active %d; want active %d, drift 0", a.SKU, a.Total, a.Available, a.Active, a.Total)
		}
	}
	if len(list) != len(skus) {
		t.Errorf("Audit: %d rows; want one per SKU (%d)", len(list), len(skus))
	}
}

// foldedUsers pairs checkDistinctText's variants (by index) that case
// folding, trimming, normalization, width folding or an e-mail canonical
// form would make one user.
var foldedUsers = [][2]int{{0, 1}, {1, 2}, {3, 4}, {4, 5}, {1, 6}, {7, 8}, {8, 9}, {9, 10}, {7, 10}}

// lookalikes are the copies of a key that checkLookalikeKeys sends: the
// key with a space before or after it (ASCII, no-break, ideographic), which
// a trimming function drops, and the key in full-width forms, with a
// ligature, or with an enclosed or superscript digit, which Unicode
// compatibility folding (NFKC, NFKD, width folding for an IME's input)
// maps back to the key.
var lookalikes = []struct {
	name string
	of   func(string) string
}{
	{"a trailing space", func(k string) string { return k + " " }},
	{"a leading space", func(k string) string { return " " + k }},
	{"a trailing no-break space", func(k string) string { return k + "\u00a0" }},
	{"full-width forms", fullWidth},
	{"the ligature ﬁ", func(k string) string { return strings.Replace(k, "fi", "\ufb01", 1) }},
	{"an enclosed digit", func(k string) string { return strings.Replace(k, "-1-", "-\u2460-", 1) }},
	{"a superscript digit", func(k string) string { return strings.Replace(k, "-1-", "-\u00b9-", 1) }},
	// Dashes that autocorrect or a PDF puts where the key had '-', and
	// characters with no width that a copy from HTML keeps: a fold "for
	// order numbers pasted from documents" maps them back to the key.
	{"an en dash", func(k string) string { return strings.Replace(k, "-", "\u2013", 1) }},
	{"a Unicode hyphen", func(k string) string { return strings.Replace(k, "-", "\u2010", 1) }},
	{"a minus sign", func(k string) string { return strings.Replace(k, "-", "\u2212", 1) }},
	{"a zero-width space", func(k string) string { return k[:3] + "\u200b" + k[3:] }},
	{"a leading byte order mark", func(k string) string { return "\ufeff" + k }},
	{"a soft hyphen", func(k string) string { return k[:3] + "\u00ad" + k[3:] }},
	// Patterns that match the key: a lookup or a transition written with
	// LIKE (or SIMILAR TO), a Redis SCAN MATCH or KEYS, or a regular
	// expression, where = was meant, finds the key by them (outsider
	// rounds 47 and 48: Lookup and Release with request_key LIKE $1 passed
	// every scenario, whose keys have no '_' or '%').
	{"LIKE's '_' for one of its characters", func(k string) string { return k[:3] + "_" + k[4:] }},
	{"its first half and LIKE's '%'", func(k string) string { return k[:len(k)/2] + "%" }},
	{"a glob's '?' for one of its characters", func(k string) string { return k[:3] + "?" + k[4:] }},
	{"its first half and a glob's '*'", func(k string) string { return k[:len(k)/2] + "*" }},
	{"a regular expression's '.' for one of its characters", func(k string) string { return k[:3] + "." + k[4:] }},
	{"a leading ideographic space", func(k string) string { return "\u3000" + k }},
}

// uuidLookalikes are the other spellings of a UUID-shaped key (RFC 4122
// reads the hex digits without case, and SDKs write it in braces, as a
// URN or without hyphens), which a strategy that canonicalizes UUID keys
// ("a retry through another SDK must replay") maps back to the key. The
// last is never reserved, as in lookalikes.
var uuidLookalikes = []struct {
	name string
	of   func(string) string
}{
	{"upper case", strings.ToUpper},
	{"braces", func(k string) string { return "{" + k + "}" }},
	{"the URN form", func(k string) string { return "urn:uuid:" + k }},
	{"no hyphens", func(k string) string { return strings.ReplaceAll(k, "-", "") }},
	{"upper case without hyphens", func(k string) string { return strings.ToUpper(strings.ReplaceAll(k, "-", "")) }},
}

// fullWidth maps printable ASCII to its full-width form (U+FF01 to U+FF5E).
func fullWidth(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '!' && r <= '~' {
			return r - '!' + '\uff01'
		}
		return r
	}, s)
}

// checkLookalikeKeys: a key that looks like another, that trimming or
// Unicode compatibility folding would turn into it, or that matches it as
// a LIKE, glob or regular-expression pattern, is another key. A
// strategy that trims keys ("clients and proxies add stray whitespace to
// Idempotency-Key headers") or folds them ("the IME types order numbers
// full-width") answers the lookalike with the bare key's reservation
// (KEY_REUSED, REPLAY), finds it by Lookup, and moves it by Release or
// Confirm. checkDistinctText's keys carry their variants inside. sku has
// len(lookalikes) units for the lookalike keys.
func checkLookalikeKeys(ctx context.Context, t tester, node strategy.Strategy, sku string) {
	t.Helper()
	checkLookalikesOf(ctx, t, node, sku, "kit-fi-1-"+sku, "kit-pad-user", lookalikes)
	// A UUID of the SKU's own (version 4 layout, lower case, as most
	// clients send it), so that every trial's is new.
	sum := sha256.Sum256([]byte(sku))
	h := hex.EncodeToString(sum[:16])
	id := h[:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:32]
	checkLookalikesOf(ctx, t, node, sku, id, "kit-uuid-user", uuidLookalikes)
}

// checkLookalikesOf reserves bare for user, then checks each lookalike of
// it: never reserved, it is unknown and moves nothing; reserved by another
// user (all but the last), it is HELD and its own.
func checkLookalikesOf(ctx context.Context, t tester, node strategy.Strategy, sku, bare, user string, lookalikes []struct {
	name string
	of   func(string) string
}) {
	t.Helper()
	if res, err := reserveUnlessBusy(ctx, node, strategy.Request{Key: bare, User: user, SKU: sku, TTL: time.Hour}); err != nil || res.Outcome != strategy.OutcomeHeld {
		t.Fatalf("Reserve of key %q: %s, %v; want HELD", bare, res.Outcome, err)
	}
	// Nothing lookalike was reserved yet: each is unknown, and moves nothing.
	for _, l := range lookalikes {
		key := l.of(bare)
		if got, err := node.Lookup(ctx, key); err != nil || got.Status != strategy.StatusNotFound {
			t.Errorf("Lookup of key %q (%q with %s), never reserved (%q is HELD): %+v, %v; want NOT_FOUND", key, bare, l.name, bare, got, err)
		}
		if c, ok := node.(strategy.Confirmer); ok {
			if moved, err := c.Confirm(ctx, key, strategy.ConfirmUntilExpired); err != nil || moved {
				t.Errorf("Confirm of key %q (%q with %s), never reserved (%q is HELD): %v, %v; want false", key, bare, l.name, bare, moved, err)
			}
		}
		if r, ok := node.(strategy.Releaser); ok {
			if n, err := r.Release(ctx, key); err != nil || n != 0 {
				t.Errorf("Release of key %q (%q with %s), never reserved (%q is HELD): %d, %v; want 0", key, bare, l.name, bare, n, err)
			}
		}
	}
	if got, err := node.Lookup(ctx, bare); err != nil || got.Status != strategy.StatusHeld {
		t.Errorf("Lookup of key %q after Confirm and Release of lookalikes of it: %+v, %v; want HELD", bare, got, err)
	}
	for i, l := range lookalikes[:len(lookalikes)-1] {
		key := l.of(bare)
		req := strategy.Request{Key: key, User: fmt.Sprintf("%s-%d", user, i), SKU: sku, TTL: time.Hour}
		if res, err := reserveUnlessBusy(ctx, node, req); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Errorf("Reserve of key %q (%q with %s; %q is HELD by another user): %s, %v; want HELD", key, bare, l.name, bare, res.Outcome, err)
			continue
		}
		if got, err := node.Lookup(ctx, key); err != nil || got.Key != key || got.User != req.User {
			t.Errorf("Lookup of key %q: %+v, %v; want its own reservation (user %q)", key, got, err, req.User)
		}
	}
}

// hashCandidates is how many keys checkHashCollisions hashes to find two
// whose PostgreSQL 32-bit text hashes collide: about 10 colliding pairs
// are expected among 300,000 (n²/2^33), none with probability 3e-5.
const hashCandidates = 300_000

// checkHashCollisions: keys, and users, whose 32-bit hashes are equal are
// still different. A strategy that finds a key or a user by hashtext(),
// the hash PostgreSQL's hash indexes and many advisory-lock keys use,
// answers a new key with another key's reservation (KEY_REUSED, REPLAY) or
// refuses a user for another's hold; a few hundred keys, as every scenario
// has, collide once in tens of thousands of runs. Here the database finds
// two colliding texts of the trial's own (a GROUP BY over generated ones)
// and they are sent as two keys and as two users, and so are the pairs of
// fixedHashCollisions (CRC-32, FNV, String.hashCode).
func checkHashCollisions(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := kitSKU("hash")
	var pairs [][]string
	rows, err := db.Query(ctx, `
SELECT (array_agg(s ORDER BY s))[1:2] FROM (
  SELECT 'kit-hash-' || g || '-' || $1::text AS s FROM generate_series(1, $2::int) g) x
GROUP BY hashtext(s) HAVING count(*) > 1 LIMIT 2`, base, hashCandidates)
	if err != nil {
		t.Fatalf("finding texts whose hashtext() collide: %v", err)
	}
	for rows.Next() {
		var p []string
		if err := rows.Scan(&p); err != nil {
			t.Fatalf("finding texts whose hashtext() collide: %v", err)
		}
		pairs = append(pairs, p)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("finding texts whose hashtext() collide: %v", err)
	}
	type collision struct {
		hash        string
		keys, users []string
	}
	var collisions []collision
	if len(pairs) > 0 { // none with probability 3e-5: the fixed pairs below still run
		collisions = append(collisions, collision{"hashtext()", pairs[0], pairs[len(pairs)-1]})
	}
	for _, c := range fixedHashCollisions {
		collisions = append(collisions, collision{c.hash, []string{c.keys[0] + "-" + base, c.keys[1] + "-" + base}, []string{c.users[0] + "-" + base, c.users[1] + "-" + base}})
	}
	var reqs []strategy.Request
	why := map[string]string{}
	for i, c := range collisions {
		for j := range 2 {
			k := strategy.Request{Key: c.keys[j], User: fmt.Sprintf("kit-hash-user-%d-%d", i, j), SKU: base, TTL: time.Hour}
			u := strategy.Request{Key: fmt.Sprintf("kit-hash-key-%d-%d-%s", i, j, base), User: c.users[j], SKU: base, TTL: time.Hour}
			reqs = append(reqs, k, u)
			why[k.Key] = fmt.Sprintf("keys %q and %q have equal %s", c.keys[0], c.keys[1], c.hash)
			why[u.Key] = fmt.Sprintf("users %q and %q have equal %s", c.users[0], c.users[1], c.hash)
		}
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: base, Total: len(reqs)}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	for _, req := range reqs {
		res, err := reserveUnlessBusy(ctx, node, req)
		if err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Errorf("Reserve key %q, user %q (%s): %s, %v; want HELD", req.Key, req.User, why[req.Key], res.Outcome, err)
			continue
		}
	}
	for _, req := range reqs {
		got, err := node.Lookup(ctx, req.Key)
		if err != nil || got.Key != req.Key || got.User != req.User {
			t.Errorf("Lookup of key %q: %+v, %v; want its own reservation (user %q)", req.Key, got, err, req.User)
		}
	}
}

// fixedHashCollisions are pairs of keys, and of users, whose 32-bit hashes
// under functions a Go or SQL author reaches for collide (found by a
// birthday search). Each function is iterated over the bytes (or UTF-16
// units) with nothing but the hash as its state, so the pairs, being of
// one length, still collide with the same suffix appended: the check
// appends its SKU to make them its own.
var fixedHashCollisions = []struct {
	hash        string
	keys, users [2]string
}{
	{"CRC-32 (IEEE)", [2]string{"kit-key-09685295", "kit-key-12060020"}, [2]string{"kit-user-09685295", "kit-user-12060020"}},
	{"CRC-32C", [2]string{"kit-key-01371838", "kit-key-02000402"}, [2]string{"kit-user-01371838", "kit-user-02000402"}},
	{"FNV-1 32", [2]string{"kit-key-00179599", "kit-key-00362382"}, [2]string{"kit-user-00174628", "kit-user-01872066"}},
	{"FNV-1a 32", [2]string{"kit-key-00324246", "kit-key-01065780"}, [2]string{"kit-user-00214246", "kit-user-01155780"}},
	{"Java's String.hashCode", [2]string{"kit-key-00721006", "kit-key-71000710"}, [2]string{"kit-user-00721006", "kit-user-71000710"}},
}

// checkJoinedText: keys, users and SKUs are whole values, never parts of a
// longer text. A strategy that indexes the user's limit on sku || ':' ||
// user_id refuses user "vip:u" on SKU "S" because user "u" holds SKU
// "S:vip"; one that keeps keys unique on a prefix (a MySQL-style prefix
// index, a key column cut at 64 characters) answers a long key with
// another key's reservation; one that passes the deployment's SKUs to SQL
// as one comma-separated text cannot find its own SKU "S,red" and finds
// another deployment's "S". The scenarios' names are short and free of
// separators, so nothing else meets these.
func checkJoinedText(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := kitSKU("joined")
	skuA, skuVIP, skuCSV := base, base+":vip", base+",red"
	joins := joinedPairs(base)
	stock := []strategy.Stock{{SKU: skuA, Total: 3 + len(joins)}, {SKU: skuVIP, Total: 1}, {SKU: skuCSV, Total: 2}}
	for _, j := range joins {
		stock = append(stock, strategy.Stock{SKU: j.holder.SKU, Total: 1})
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open with SKUs %q, %q, %q and %d joined to others: %v", skuA, skuVIP, skuCSV, len(joins), err)
	}
	defer dep.Close()
	node := dep.Node(0)
	// Two keys that share their first 105 bytes, and two users their first
	// 54, each within the contract's lengths.
	longKey := "kit-" + base + "-" + strings.Repeat("x", 100-len(base))
	longUser := "kit-" + strings.Repeat("y", 50)
	reqs := []struct {
		what string
		req  strategy.Request
	}{
		{"user u holds SKU S:vip", strategy.Request{Key: "kit-joined-1-" + base, User: "kit-u", SKU: skuVIP}},
		{"user vip:u asks for SKU S (S + ':' + vip:u is S:vip + ':' + u)", strategy.Request{Key: "kit-joined-2-" + base, User: "vip:kit-u", SKU: skuA}},
		{"a long key", strategy.Request{Key: longKey + "-1", User: "kit-joined-long-1", SKU: skuA}},
		{"a long key with the same first 105 bytes", strategy.Request{Key: longKey + "-2", User: "kit-joined-long-2", SKU: skuA}},
		{"a long user on SKU S,red", strategy.Request{Key: "kit-joined-5-" + base, User: longUser + "-1", SKU: skuCSV}},
		{"a long user with the same first 54 bytes, on the same SKU", strategy.Request{Key: "kit-joined-6-" + base, User: longUser + "-2", SKU: skuCSV}},
	}
	// The last is the CSV SKU's: released below. The joined pairs go first.
	var joined []struct {
		what string
		req  strategy.Request
	}
	for _, j := range joins {
		joined = append(joined, struct {
			what string
			req  strategy.Request
		}{j.why + ": the holder", j.holder}, struct {
			what string
			req  strategy.Request
		}{j.why + ": the asker", j.asker})
	}
	reqs = append(joined, reqs...)
	for _, r := range reqs {
		r.req.TTL = time.Hour
		res, err := reserveUnlessBusy(ctx, node, r.req)
		if err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Errorf("%s (key %q, user %q, sku %q): %s, %v; want HELD (keys, users and SKUs are whole values)", r.what, r.req.Key, r.req.User, r.req.SKU, res.Outcome, err)
			continue
		}
		if got, err := node.Lookup(ctx, r.req.Key); err != nil || got.Key != r.req.Key || got.User != r.req.User || got.SKU != r.req.SKU {
			t.Errorf("Lookup of %s's key %q: %+v, %v; want its own reservation", r.what, r.req.Key, got, err)
		}
	}
	// The SKU with a comma: its reservation is the deployment's to
	// release, and another deployment's SKU S is not, though it is one
	// comma-separated part of this one's.
	other, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: base + "-b", Total: 1}}})
	if err != nil {
		t.Fatalf("Open of a second deployment: %v", err)
	}
	defer other.Close()
	if rel, ok := node.(strategy.Releaser); ok {
		if units, err := rel.Release(ctx, reqs[len(reqs)-1].req.Key); err != nil || units != 1 {
			t.Errorf("Release of the reservation of SKU %q: %d units, %v; want 1", skuCSV, units, err)
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	got := map[string]bool{}
	for _, a := range list {
		got[a.SKU] = true
	}
	if len(list) != len(stock) || !got[skuA] || !got[skuVIP] || !got[skuCSV] {
		t.Errorf("Audit: %+v; want one row for each of %q, %q, %q and the %d SKUs joined to others", list, skuA, skuVIP, skuCSV, len(joins))
	}
	for _, j := range joins {
		if !got[j.holder.SKU] {
			t.Errorf("Audit: no row for SKU %q (%s)", j.holder.SKU, j.why)
		}
	}
}

// joinedPair is a holder and an asker whose user and SKU, joined by one
// separator in one order, are the same text.
type joinedPair struct {
	why           string
	holder, asker strategy.Request
}

// joinSeparators are what a per-user index or a Redis key puts between a
// user and a SKU: the usual punctuation, a space, and nothing.
var joinSeparators = []string{":", "|", "/", "#", ".", "-", "_", " ", ""}

// joinedPairs are, for each of joinSeparators and each order, a holder of a
// SKU and an asker of skuA whose user and SKU join into the holder's:
// SKU-first, the holder (u, S+sep+x) and the asker (x+sep+u, S); user-first,
// the holder (u, x+sep+S) and the asker (u+sep+x, S). Outsider round 48's
// index on user_id || ':' || sku passed the SKU-first pair alone.
func joinedPairs(skuA string) []joinedPair {
	var out []joinedPair
	for i, sep := range joinSeparators {
		u, x := fmt.Sprintf("kit-j%d", i), fmt.Sprintf("x%d", i)
		out = append(out,
			joinedPair{fmt.Sprintf("sku %q user: %q and %q joined by %q", "S", "u", "x"+sep+"u", sep),
				strategy.Request{Key: fmt.Sprintf("kit-joined-s%d-h-%s", i, skuA), User: u, SKU: skuA + sep + x},
				strategy.Request{Key: fmt.Sprintf("kit-joined-s%d-a-%s", i, skuA), User: x + sep + u, SKU: skuA}},
			joinedPair{fmt.Sprintf("user then sku: %q and %q joined by %q", "u", "u"+sep+"x", sep),
				strategy.Request{Key: fmt.Sprintf("kit-joined-u%d-h-%s", i, skuA), User: u + "u", SKU: x + sep + skuA},
				strategy.Request{Key: fmt.Sprintf("kit-joined-u%d-a-%s", i, skuA), User: u + "u" + sep + x, SKU: skuA}})
	}
	return out
}

// checkSKUsApart: two SKUs are two stocks, however alike their names. A
// strategy that names a SKU's state outside its row by a hash of the name
// ("a safe, fixed-length Redis key"), or by the name cut to a length ("key
// names are capped at 64 bytes"), gives two SKUs one counter: the one
// opened last sets it, and they sell from it together, the smaller past its
// total. The scenarios' SKUs differ early in short names, and the hash
// pairs of checkHashCollisions are keys and users. Here one deployment
// opens, in pairs, SKUs whose CRC-32, CRC-32C, FNV-1, FNV-1a or
// String.hashCode are equal, and two SKUs of the longest length allowed
// that differ only in the last byte, the first of each pair with 1 unit
// and the second with 3; four users ask for each: exactly its total is
// HELD, and each audit balances with every unit active.
func checkSKUsApart(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := kitSKU("apart")
	type pair struct {
		why  string
		skus [2]string
	}
	var pairs []pair
	for _, c := range fixedHashCollisions {
		pairs = append(pairs, pair{"equal " + c.hash, [2]string{c.keys[0] + "-" + base, c.keys[1] + "-" + base}})
	}
	long := fill(base+"-long-", strategy.MaxSKULen-1)
	pairs = append(pairs, pair{"the longest allowed, differing only in the last byte", [2]string{long + "a", long + "b"}})
	totals := [2]int{1, 3}
	var stock []strategy.Stock
	for _, p := range pairs {
		for j, sku := range p.skus {
			stock = append(stock, strategy.Stock{SKU: sku, Total: totals[j]})
		}
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open of SKUs in pairs (%s, ...): %v", pairs[0].why, err)
	}
	defer dep.Close()
	node := dep.Node(0)
	const asks = 4
	for i, p := range pairs {
		for j, sku := range p.skus {
			held := 0
			for u := range asks {
				req := strategy.Request{Key: fmt.Sprintf("kit-apart-%d-%d-%d-%s", i, j, u, base), User: fmt.Sprintf("kit-apart-%d", u), SKU: sku, TTL: time.Hour}
				res, err := reserveUnlessBusy(ctx, node, req)
				if err != nil {
					t.Fatalf("Reserve %q: %v", req.Key, err)
				}
				if res.Outcome == strategy.OutcomeHeld {
					held++
				}
			}
			if held != totals[j] {
				t.Errorf("SKU %q of %d units (its pair %q has %d; %s): %d of %d requests HELD; want %d", sku, totals[j], p.skus[1-j], totals[1-j], p.why, held, asks, totals[j])
			}
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	for _, a := range list {
		if a.Active != a.Total || a.Available != 0 || a.Drift() != 0 {
			t.Errorf("Audit of SKU %q: total %d, available %d, active %d; want every unit active", a.SKU, a.Total, a.Available, a.Active)
		}
	}
}
