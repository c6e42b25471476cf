package strategytest

import (
	"fmt"
	"sort"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// expirySlack is how far a reported ExpiresAt may stray from the window
// the harness saw the request in, plus its TTL: the harness, PostgreSQL
// and Redis share a clock to within a second on one machine or under NTP,
// while a TTL read in the wrong unit or replaced by a default is off by
// minutes to days.
const expirySlack = 10 * time.Second

// checkExpiresAt checks that a HELD reservation expires its TTL after it
// was made, both in the answer and in the database. A strategy that reads
// ttl_ms as seconds, or ignores the TTL, otherwise passes every scenario:
// expiry is tested by moving expires_at into the past (Ager), and a
// reservation that expires too late is invisible within a trial.
func (t *trial) checkExpiresAt(heldBy map[string][]Op, durable map[string]strategy.Reservation) {
	t.madeDueMu.Lock()
	madeDue := t.madeDue
	t.madeDueMu.Unlock()
	var wrong, wrongKeys []string
	// A step of the wall clock during the trial (seen once on a virtual
	// machine: 25 s forward, between a request and its insert) moves what
	// PostgreSQL stamps, not the history's monotonic offsets.
	slack := expirySlack + t.hist.WallStep().Abs()
	judge := func(op Op, at time.Time, where string) {
		lo := t.hist.Wall(op.Invoke).Add(op.Req.TTL - slack)
		hi := t.hist.Wall(op.Complete).Add(op.Req.TTL + slack)
		if at.Before(lo) || at.After(hi) {
			wrong = append(wrong, fmt.Sprintf("%s (TTL %s): %s expires_at is %s after the request began", t.plain(op.Req.Key), op.Req.TTL, where, at.Sub(t.hist.Wall(op.Invoke)).Round(time.Millisecond)))
			wrongKeys = append(wrongKeys, op.Req.Key)
		}
	}
	for k, held := range heldBy {
		op := held[0]
		judge(op, op.Answer.ExpiresAt, "the HELD answer's")
		if d := durable[k]; d.Status == strategy.StatusHeld && !madeDue[k] && len(held) == 1 {
			judge(op, d.ExpiresAt, "the stored")
		}
	}
	sort.Strings(wrong)
	t.check(Base, "a HELD reservation expires its TTL after it was made", len(wrong) == 0,
		fmt.Sprintf("%d expiry times outside [request + TTL - %s, answer + TTL + %s]: %s", len(wrong), slack, slack, sample(wrong)), wrongKeys...)
}

// checkUserLimitAnswers checks that USER_LIMIT is answered only when the
// user holds, or is concurrently taking, a reservation for the same SKU
// under another key: a limit enforced per user instead of per user and
// SKU, or one that still counts a reservation released before the request
// began, refuses a request the contract says must be served. The check is
// lenient where the history cannot tell: any other attempt by the user on
// the SKU that was invoked before the answer and that took effect or may
// have (HELD, REPLAY, unknown, or a row under its key) explains it, even
// one whose transaction later rolled back.
func (t *trial) checkUserLimitAnswers(ops []Op, durable map[string]strategy.Reservation) {
	type userSKU struct{ user, sku string }
	attempts := map[userSKU][]Op{}
	releasedAt := map[string]time.Duration{} // key -> completion of its first acknowledged release
	for _, op := range ops {
		switch {
		case op.Kind == "reserve" && op.Req.Validate() == nil:
			u := userSKU{op.Req.User, op.Req.SKU}
			attempts[u] = append(attempts[u], op)
		case op.Kind == "release" && op.Type == OpOK && op.Units > 0:
			if at, ok := releasedAt[op.Req.Key]; !ok || op.Complete < at {
				releasedAt[op.Req.Key] = op.Complete
			}
		}
	}
	var phantom, phantomKeys []string
	for _, op := range ops {
		if op.Kind != "reserve" || op.Outcome != strategy.OutcomeUserLimit {
			continue
		}
		explained := false
		for _, other := range attempts[userSKU{op.Req.User, op.Req.SKU}] {
			if other.Req.Key == op.Req.Key || other.Invoke > op.Complete {
				continue
			}
			if at, ok := releasedAt[other.Req.Key]; ok && at < op.Invoke {
				continue // released before this request began
			}
			tookEffect := other.Type == OpOK || other.Type == OpInfo || durable[other.Req.Key].Status != strategy.StatusNotFound
			if tookEffect {
				explained = true
				break
			}
		}
		if !explained {
			phantom = append(phantom, fmt.Sprintf("%s (user %s, sku %s)", t.plain(op.Req.Key), t.plain(op.Req.User), t.plain(op.Req.SKU)))
			phantomKeys = append(phantomKeys, op.Req.Key)
		}
	}
	sort.Strings(phantom)
	t.check(Base, "USER_LIMIT only while the user holds the same SKU", len(phantom) == 0,
		fmt.Sprintf("%d requests answered USER_LIMIT with no other reservation of that user and SKU to explain it: %s", len(phantom), sample(phantom)), phantomKeys...)
}

// checkAnswerContents checks the reservation each answer carries: HELD and
// REPLAY carry the request's own reservation (HELD in status HELD, REPLAY
// in a status it exists in), KEY_REUSED the reservation that owns the key.
// A client shows the user what the answer says, whatever the database
// holds.
func (t *trial) checkAnswerContents(ops []Op, durable map[string]strategy.Reservation) {
	t.madeDueMu.Lock()
	madeDue := t.madeDue
	t.madeDueMu.Unlock()
	// An owner's expires_at, as a REPLAY or KEY_REUSED reports it, is the
	// one stored: nothing but an Ager changes it. A strategy that answers
	// about an owner it has not read (from a marker, a cache) fills in what
	// it does not know.
	wrongExpiry := func(op Op) string {
		d, a := durable[op.Req.Key], op.Answer
		if d.Status == "" || d.Status == strategy.StatusNotFound || madeDue[op.Req.Key] || a.ExpiresAt.Sub(d.ExpiresAt).Abs() <= time.Millisecond {
			return ""
		}
		return fmt.Sprintf("carries expires_at %s, the stored one is %s", a.ExpiresAt.Format(time.RFC3339Nano), d.ExpiresAt.Format(time.RFC3339Nano))
	}
	var wrong, wrongKeys []string
	for _, op := range ops {
		if op.Kind != "reserve" || op.Req.Validate() != nil {
			continue
		}
		a := op.Answer
		var why string
		switch op.Outcome {
		case strategy.OutcomeHeld, strategy.OutcomeReplay:
			switch {
			case a.Key != op.Req.Key || a.User != op.Req.User || a.SKU != op.Req.SKU:
				why = fmt.Sprintf("carries key %q user %q sku %q", t.plain(a.Key), t.plain(a.User), t.plain(a.SKU))
			case op.Outcome == strategy.OutcomeHeld && a.Status != strategy.StatusHeld:
				why = fmt.Sprintf("carries status %s", a.Status)
			case op.Outcome == strategy.OutcomeReplay && (a.Status == "" || a.Status == strategy.StatusNotFound):
				why = fmt.Sprintf("carries status %q", a.Status)
			case op.Outcome == strategy.OutcomeReplay:
				why = wrongExpiry(op)
			}
		case strategy.OutcomeKeyReused:
			switch d := durable[op.Req.Key]; {
			case d.Status != strategy.StatusNotFound && (a.Key != op.Req.Key || a.User != d.User || a.SKU != d.SKU):
				why = fmt.Sprintf("carries key %q user %q sku %q, the owner is user %q sku %q", t.plain(a.Key), t.plain(a.User), t.plain(a.SKU), t.plain(d.User), t.plain(d.SKU))
			case d.Status != strategy.StatusNotFound && (a.Status == "" || a.Status == strategy.StatusNotFound):
				why = fmt.Sprintf("carries status %q", a.Status)
			default:
				why = wrongExpiry(op)
			}
		}
		if why != "" {
			wrong = append(wrong, fmt.Sprintf("%s answered %s %s", t.plain(op.Req.Key), op.Outcome, why))
			wrongKeys = append(wrongKeys, op.Req.Key)
		}
	}
	sort.Strings(wrong)
	t.check(Base, "an answer carries its own reservation (HELD, REPLAY) or the key's owner (KEY_REUSED), as stored", len(wrong) == 0,
		fmt.Sprintf("%d answers: %s", len(wrong), sample(wrong)), wrongKeys...)
}
