package memquota_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/memquota"
	"github.com/reservebench/reservebench/strategy"
)

var modes = []struct {
	name string
	mode memquota.RestartMode
}{{"from-config", memquota.FromConfig}, {"from-log", memquota.FromLog}}

func TestRegistered(t *testing.T) {
	for name, want := range map[string]strategy.Claims{"memquota": memquota.ConfigClaims, "memquota-recover": memquota.LogClaims} {
		meta := registered(t, name)
		assert.Equal(t, want, meta.Claims, name)
		assert.NotEmpty(t, meta.Description, name)
		assert.NotContains(t, meta.Description, "\n", name)
		assert.NotEmpty(t, meta.Correctness, name)
		assert.False(t, meta.Claims.Has(strategy.NoPhantomSoldOut), "%s: a stranded share or an attempt held open answers SOLD_OUT while units are free", name)
	}
	assert.False(t, memquota.ConfigClaims.Has(strategy.SurvivesRestart))
	assert.True(t, memquota.LogClaims.Has(strategy.SurvivesRestart|strategy.NoOversell|strategy.Conserves))
}

// TestContention is C28-13: 120 users, one request each, 40 units over 2
// nodes (20 each): exactly 40 HELD, 20 per node, drift 0.
func TestContention(t *testing.T) {
	db := freshDB(t)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ctx := testCtx(t)
			dep, sku := deploy(t, db, m.mode, 2, 40)
			got := outcomes(sendAll(ctx, dep, roundRobin(distinct("c", sku, 0, 120), 2)))
			require.Equal(t, map[string]int{"HELD": 40, "SOLD_OUT": 80}, got)
			a := audit(t, dep)
			require.Equal(t, 40, a.Total)
			require.Equal(t, 0, a.Available)
			require.Equal(t, 40, a.Active)
			require.Equal(t, 0, a.Drift())
			for _, n := range a.Nodes {
				require.Equal(t, strategy.NodeAudit{Node: n.Node, Share: 20, Available: 0, Active: 20, Sold: 20}, n)
			}
		})
	}
}

// TestRestartOversell is C28-15: 40 units over 2 nodes; node 0 sells its 20,
// node 1 its 20, node 0 restarts and is offered 20 more. From config it
// sells them again, and the audit, not this test, finds 60 active sales for
// 40 units. From the log it sells none.
func TestRestartOversell(t *testing.T) {
	db := freshDB(t)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ctx := testCtx(t)
			dep, sku := deploy(t, db, m.mode, 2, 40)
			first := append(distinct("n0", sku, 0, 20), distinct("n1", sku, 1, 20)...)
			require.Equal(t, map[string]int{"HELD": 40}, outcomes(sendAll(ctx, dep, first)))
			require.NoError(t, dep.Restart(ctx, 0))
			again := outcomes(sendAll(ctx, dep, distinct("again", sku, 0, 20)))
			a := audit(t, dep)
			t.Logf("%s: after the restart node 0 answered %v; audit: total %d, available %d, active %d, oversold %d, drift %d; node 0 %+v",
				m.name, again, a.Total, a.Available, a.Active, a.Oversold(), a.Drift(), a.Nodes[0])
			if m.mode == memquota.FromConfig {
				require.Equal(t, map[string]int{"HELD": 20}, again)
				require.Equal(t, 60, a.Active, "60 sales")
				require.Equal(t, 40, a.Total)
				require.Equal(t, 20, a.Oversold(), "60 sales > 40")
				require.Equal(t, -20, a.Drift())
				require.Equal(t, strategy.NodeAudit{Node: 0, Share: 20, Available: 0, Active: 40, Sold: 40}, a.Nodes[0])
				return
			}
			require.Equal(t, map[string]int{"SOLD_OUT": 20}, again)
			require.Equal(t, 40, a.Active)
			require.Equal(t, 0, a.Oversold())
			require.Equal(t, 0, a.Drift())
			require.Equal(t, strategy.NodeAudit{Node: 0, Share: 20, Available: 0, Active: 20, Sold: 20}, a.Nodes[0])
		})
	}
}

// TestCrashBetweenDecrementAndLog is the crash the seed did not test: a
// request that dies after the in-memory decrement and before its log row.
// Its unit is gone from the counter and held by no row: the audit shows a
// positive drift and the node sells less than its share (undersell). A
// FromLog restart recounts the log and restores exactly the lost units; a
// FromConfig restart restores the whole share, so the node then sells its
// already sold units again.
func TestCrashBetweenDecrementAndLog(t *testing.T) {
	db := freshDB(t)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ctx := testCtx(t)
			dep, sku := deploy(t, db, m.mode, 2, 20) // 10 units per node

			dying := distinct("die", sku, 0, 3)
			for _, c := range dying {
				require.ErrorIs(t, dep.CrashMidReserve(ctx, c.node, c.req), memquota.ErrCrashed)
			}
			for _, c := range dying {
				r, err := dep.Node(0).Lookup(ctx, c.req.Key)
				require.NoError(t, err)
				require.Equal(t, strategy.StatusNotFound, r.Status, "a request that died before its row left no row")
			}
			a := audit(t, dep)
			require.Equal(t, 3, a.Drift(), "3 units lost: gone from memory, in no row")
			require.Equal(t, 7, a.Nodes[0].Available)

			// Undersell: node 0 sells 7 of its 10 and says SOLD_OUT.
			sold := outcomes(sendAll(ctx, dep, distinct("buy", sku, 0, 12)))
			require.Equal(t, map[string]int{"HELD": 7, "SOLD_OUT": 5}, sold)
			a = audit(t, dep)
			require.Equal(t, strategy.NodeAudit{Node: 0, Share: 10, Available: 0, Active: 7, Sold: 7}, a.Nodes[0])
			require.Equal(t, 3, a.Drift())
			t.Logf("before the restart: node 0 %+v, drift %d (units lost)", a.Nodes[0], a.Drift())

			require.NoError(t, dep.Restart(ctx, 0))
			a = audit(t, dep)
			t.Logf("after a %s restart: node 0 %+v, drift %d", m.name, a.Nodes[0], a.Drift())
			if m.mode == memquota.FromLog {
				require.Equal(t, 3, a.Nodes[0].Available, "share 10 - 7 active rows: exactly the 3 lost units")
				require.Equal(t, 0, a.Drift())
				more := outcomes(sendAll(ctx, dep, distinct("after", sku, 0, 5)))
				require.Equal(t, map[string]int{"HELD": 3, "SOLD_OUT": 2}, more)
				a = audit(t, dep)
				require.Equal(t, 10, a.Nodes[0].Active, "node 0 sold exactly its share")
				require.Equal(t, 0, a.Drift())
				return
			}
			require.Equal(t, 10, a.Nodes[0].Available, "the whole configured share, although 7 are sold")
			require.Equal(t, -7, a.Drift(), "7 units counted twice")
			more := outcomes(sendAll(ctx, dep, append(distinct("after", sku, 0, 10), distinct("other", sku, 1, 10)...)))
			require.Equal(t, map[string]int{"HELD": 20}, more)
			a = audit(t, dep)
			require.Equal(t, 27, a.Active)
			require.Equal(t, 7, a.Oversold(), "27 sales > 20")
		})
	}
}

// TestCrashBeforeGiveBack: a release or expiry whose statement committed but
// whose process died before the units reached memory. The rows moved once
// (a rerun returns nothing), the units are lost until a FromLog restart
// counts the log again.
func TestCrashBeforeGiveBack(t *testing.T) {
	ctx := testCtx(t)
	dep, sku := deploy(t, freshDB(t), memquota.FromLog, 2, 10)
	calls := roundRobin(distinct("h", sku, 0, 4), 2)
	require.Equal(t, map[string]int{"HELD": 4}, outcomes(sendAll(ctx, dep, calls)))
	keys := []string{calls[0].req.Key, calls[1].req.Key, calls[2].req.Key}
	n, err := dep.MakeDue(ctx, keys[:2])
	require.NoError(t, err)
	require.Equal(t, 2, n)

	require.ErrorIs(t, memquota.ExpireDueDying(ctx, dep, 0), memquota.ErrCrashed)
	require.ErrorIs(t, memquota.ReleaseDying(ctx, dep, 1, keys[2]), memquota.ErrCrashed)

	units, err := dep.Node(1).(strategy.Expirer).ExpireDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, units, "the rerun finds nothing due: the rows moved the first time")
	a := audit(t, dep)
	require.Equal(t, 1, a.Active)
	require.Equal(t, 3, a.Drift(), "3 units moved out of HELD but never reached memory")

	require.NoError(t, dep.Restart(ctx, 0))
	require.NoError(t, dep.Restart(ctx, 1))
	a = audit(t, dep)
	require.Equal(t, 0, a.Drift())
	require.Equal(t, 9, a.Available)
}

// TestDuplicateKeyStorm is C28-04, 50 times: 16 concurrent copies of one
// request, once spread over both nodes and once all on one node whose share
// (5) is smaller than the number of copies, then the key with another user
// and another SKU. Every trial must be exact: {HELD 1, REPLAY 15}, the stock
// down by one, KEY_REUSED for the others.
func TestDuplicateKeyStorm(t *testing.T) {
	db := freshDB(t)
	for trial := 1; trial <= 50; trial++ {
		for _, spread := range []string{"both nodes", "one node"} {
			ctx := testCtx(t)
			sku, other := newSKU("dup"), newSKU("dup-other")
			dep, err := memquota.Open(ctx, strategy.Config{DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 10}, {SKU: other, Total: 10}}}, memquota.Options{})
			require.NoError(t, err)
			req := strategy.Request{Key: "req-dup-" + sku, User: "user-0042", SKU: sku, TTL: strategy.TTLForever}
			calls := make([]call, 16)
			for i := range calls {
				calls[i] = call{node: i % 2, req: req}
				if spread == "one node" {
					calls[i].node = 0
				}
			}
			answers := sendAll(ctx, dep, calls)
			require.Equal(t, map[string]int{"HELD": 1, "REPLAY": 15}, outcomes(answers), "trial %d, %s", trial, spread)
			for _, a := range answers {
				require.Equal(t, strategy.StatusHeld, a.res.Reservation.Status, "trial %d", trial)
				require.Equal(t, "user-0042", a.res.Reservation.User, "trial %d", trial)
				require.False(t, a.res.Reservation.ExpiresAt.IsZero(), "trial %d", trial)
			}
			reused := sendAll(ctx, dep, []call{
				{0, strategy.Request{Key: req.Key, User: "user-0043", SKU: sku, TTL: strategy.TTLForever}},
				{1, strategy.Request{Key: req.Key, User: "user-0042", SKU: other, TTL: strategy.TTLForever}},
			})
			require.Equal(t, map[string]int{"KEY_REUSED": 2}, outcomes(reused), "trial %d", trial)
			require.Equal(t, "user-0042", reused[0].res.Reservation.User)
			list, err := dep.Audit(ctx)
			require.NoError(t, err)
			require.Equal(t, 9, list[0].Available, "trial %d, %s: stock down by one", trial, spread)
			require.Equal(t, 1, list[0].Active)
			require.Equal(t, 0, list[0].Drift())
			require.Equal(t, 10, list[1].Available)
			require.Equal(t, 0, list[1].Drift())
			require.NoError(t, dep.Close())
		}
	}
}

// TestReplayOnExhaustedNode: a node with no unit left still answers a known
// key REPLAY (or KEY_REUSED), never SOLD_OUT: it looks the key up first.
func TestReplayOnExhaustedNode(t *testing.T) {
	ctx := testCtx(t)
	dep, sku := deploy(t, freshDB(t), memquota.FromConfig, 2, 2) // 1 unit per node
	req := strategy.Request{Key: "k-" + sku, User: "u1", SKU: sku, TTL: time.Minute}
	res, err := dep.Node(0).Reserve(ctx, req)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	res, err = dep.Node(1).Reserve(ctx, strategy.Request{Key: "k2-" + sku, User: "u2", SKU: sku, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	require.Equal(t, 0, audit(t, dep).Available)

	for node := 0; node < 2; node++ {
		res, err = dep.Node(node).Reserve(ctx, req)
		require.NoError(t, err)
		require.Equal(t, strategy.OutcomeReplay, res.Outcome, "node %d", node)
		require.Equal(t, strategy.StatusHeld, res.Reservation.Status)
		res, err = dep.Node(node).Reserve(ctx, strategy.Request{Key: req.Key, User: "u9", SKU: sku, TTL: time.Minute})
		require.NoError(t, err)
		require.Equal(t, strategy.OutcomeKeyReused, res.Outcome, "node %d", node)
		require.Equal(t, "u1", res.Reservation.User)
	}
	res, err = dep.Node(0).Reserve(ctx, strategy.Request{Key: "k3-" + sku, User: "u3", SKU: sku, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeSoldOut, res.Outcome)
}

// TestUserLimitStorm is C28-04's second half, 50 times: 8 concurrent
// requests from one user with different keys over both nodes: {HELD 1,
// USER_LIMIT 7}, the stock down by one, every trial.
func TestUserLimitStorm(t *testing.T) {
	db := freshDB(t)
	for trial := 1; trial <= 50; trial++ {
		ctx := testCtx(t)
		sku := newSKU("ul")
		dep, err := memquota.Open(ctx, strategy.Config{DB: db, Nodes: 2, Stock: []strategy.Stock{{SKU: sku, Total: 10}}}, memquota.Options{Restart: memquota.FromLog})
		require.NoError(t, err)
		calls := make([]call, 8)
		for i := range calls {
			calls[i] = call{node: i % 2, req: strategy.Request{Key: fmt.Sprintf("ul-%d-%s", i, sku), User: "user-0042", SKU: sku, TTL: strategy.TTLForever}}
		}
		require.Equal(t, map[string]int{"HELD": 1, "USER_LIMIT": 7}, outcomes(sendAll(ctx, dep, calls)), "trial %d", trial)
		a := audit(t, dep)
		require.Equal(t, 9, a.Available, "trial %d", trial)
		require.Equal(t, 1, a.Active, "trial %d", trial)
		require.Equal(t, 0, a.Drift(), "trial %d", trial)
		require.NoError(t, dep.Close())
	}
}

// TestExpiryReplay is C28-07 on two nodes: 20 held (10 sold by each node),
// 8 expire: the job returns 8, a replay 0, 4 concurrent replays 0; the other
// 12 expire and 4 concurrent jobs return 12 in total. Each unit goes back to
// the node that sold it, whichever node runs the job.
func TestExpiryReplay(t *testing.T) {
	ctx := testCtx(t)
	dep, sku := deploy(t, freshDB(t), memquota.FromConfig, 2, 40)
	calls := roundRobin(distinct("e", sku, 0, 20), 2)
	require.Equal(t, map[string]int{"HELD": 20}, outcomes(sendAll(ctx, dep, calls)))
	var keys []string
	for _, c := range calls {
		keys = append(keys, c.req.Key)
	}
	expire := func(node int) int {
		units, err := dep.Node(node).(strategy.Expirer).ExpireDue(ctx)
		require.NoError(t, err)
		return units
	}
	concurrent := func() int {
		units := make(chan int, 4)
		for w := 0; w < 4; w++ {
			go func() {
				u, err := dep.Node(w % 2).(strategy.Expirer).ExpireDue(ctx)
				if err != nil {
					u = -1000
				}
				units <- u
			}()
		}
		sum := 0
		for w := 0; w < 4; w++ {
			sum += <-units
		}
		return sum
	}

	n, err := dep.MakeDue(ctx, keys[:8]) // 4 sold by each node
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Equal(t, 8, expire(1), "the job, run on node 1")
	a := audit(t, dep)
	require.Equal(t, 14, a.Nodes[0].Available, "node 0: 20 - 10 sold + 4 expired")
	require.Equal(t, 14, a.Nodes[1].Available)
	require.Equal(t, 0, a.Drift())
	require.Equal(t, 0, expire(0), "replay")
	require.Equal(t, 0, concurrent(), "4 concurrent replays")

	n, err = dep.MakeDue(ctx, keys[8:])
	require.NoError(t, err)
	require.Equal(t, 12, n)
	require.Equal(t, 12, concurrent(), "4 concurrent jobs over 12 due")
	a = audit(t, dep)
	require.Equal(t, 40, a.Available)
	require.Equal(t, 0, a.Active)
	require.Equal(t, 0, a.Drift())
	for _, k := range keys {
		r, err := dep.Node(0).Lookup(ctx, k)
		require.NoError(t, err)
		require.Equal(t, strategy.StatusExpired, r.Status)
	}

	// Release and confirm: the unit comes back once, a confirmed one never.
	res, err := dep.Node(0).Reserve(ctx, strategy.Request{Key: "rel-" + sku, User: "r1", SKU: sku, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	units, err := dep.Node(1).(strategy.Releaser).Release(ctx, "rel-"+sku)
	require.NoError(t, err)
	require.Equal(t, 1, units)
	units, err = dep.Node(0).(strategy.Releaser).Release(ctx, "rel-"+sku)
	require.NoError(t, err)
	require.Equal(t, 0, units, "release replay")
	moved, err := dep.Node(0).(strategy.Confirmer).Confirm(ctx, "rel-"+sku, strategy.ConfirmUntilExpired)
	require.NoError(t, err)
	require.False(t, moved, "a released reservation cannot be confirmed")

	res, err = dep.Node(0).Reserve(ctx, strategy.Request{Key: "conf-" + sku, User: "c1", SKU: sku, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome)
	n, err = dep.MakeDue(ctx, []string{"conf-" + sku})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	moved, err = dep.Node(0).(strategy.Confirmer).Confirm(ctx, "conf-"+sku, strategy.ConfirmBeforeExpiry)
	require.NoError(t, err)
	require.False(t, moved, "past expires_at: not confirmed before expiry")
	moved, err = dep.Node(0).(strategy.Confirmer).Confirm(ctx, "conf-"+sku, strategy.ConfirmUntilExpired)
	require.NoError(t, err)
	require.True(t, moved, "not yet expired by the job: the late payment wins")
	require.Equal(t, 0, expire(0), "a confirmed reservation does not expire")
	a = audit(t, dep)
	require.Equal(t, 1, a.Active)
	require.Equal(t, 39, a.Available)
	require.Equal(t, 0, a.Drift())
}

// TestBadInput: every malformed request, and an unknown SKU, is BAD_REQUEST
// with a *strategy.RequestError naming the field, on a node and in a
// session, and writes nothing: no row, no unit taken.
func TestBadInput(t *testing.T) {
	ctx := testCtx(t)
	dep, sku := deploy(t, freshDB(t), memquota.FromConfig, 1, 3)
	valid := strategy.Request{Key: "bad-" + sku, User: "user-1", SKU: sku, TTL: time.Minute}
	cases := []struct {
		name, field string
		edit        func(*strategy.Request)
	}{
		{"empty key", "key", func(r *strategy.Request) { r.Key = "" }},
		{"empty user", "user", func(r *strategy.Request) { r.User = "" }},
		{"empty sku", "sku", func(r *strategy.Request) { r.SKU = "" }},
		{"oversized key", "key", func(r *strategy.Request) { r.Key = strings.Repeat("k", strategy.MaxKeyLen+1) }},
		{"oversized user", "user", func(r *strategy.Request) { r.User = strings.Repeat("u", strategy.MaxUserLen+1) }},
		{"key not UTF-8", "key", func(r *strategy.Request) { r.Key = "k\xff" }},
		{"NUL in user", "user", func(r *strategy.Request) { r.User = "u\x00" }},
		{"separator in key", "key", func(r *strategy.Request) { r.Key = "k\x1fu" }},
		{"zero TTL", "ttl", func(r *strategy.Request) { r.TTL = 0 }},
		{"TTL over the maximum", "ttl", func(r *strategy.Request) { r.TTL = strategy.MaxTTL + time.Second }},
		{"unknown sku", "sku", func(r *strategy.Request) { r.SKU = "nobody-sells-" + sku }},
	}
	sess, err := dep.Node(0).(strategy.SessionOpener).OpenSession(ctx)
	require.NoError(t, err)
	defer sess.Rollback(ctx)
	for _, c := range cases {
		req := valid
		c.edit(&req)
		for _, where := range []string{"node", "session"} {
			var res strategy.Result
			var err error
			if where == "node" {
				res, err = dep.Node(0).Reserve(ctx, req)
			} else {
				res, err = sess.Reserve(ctx, req)
			}
			require.Equal(t, strategy.OutcomeBadRequest, res.Outcome, "%s (%s)", c.name, where)
			require.ErrorIs(t, err, strategy.ErrBadRequest, "%s (%s)", c.name, where)
			var rerr *strategy.RequestError
			require.True(t, errors.As(err, &rerr), "%s (%s): %v", c.name, where, err)
			require.Equal(t, c.field, rerr.Field, "%s (%s)", c.name, where)
		}
	}
	require.NoError(t, sess.Rollback(ctx))
	r, err := dep.Node(0).Lookup(ctx, valid.Key)
	require.NoError(t, err)
	require.Equal(t, strategy.StatusNotFound, r.Status)
	a := audit(t, dep)
	require.Equal(t, strategy.StockAudit{SKU: sku, Total: 3, Available: 3, Active: 0, Nodes: []strategy.NodeAudit{{Node: 0, Share: 3, Available: 3}}}, a)

	res, err := dep.Node(0).Reserve(ctx, valid)
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, res.Outcome, "a valid request after the malformed ones")
}

// TestStorm is seed 002's shape: 10,000 concurrent requests for 1 unit over
// 2 nodes, through the pool of at most 32 connections: exactly 1 HELD.
func TestStorm(t *testing.T) {
	ctx := testCtx(t)
	db := freshDB(t)
	dep, sku := deploy(t, db, memquota.FromConfig, 2, 1)
	start := time.Now()
	answers := sendAll(ctx, dep, roundRobin(distinct("s", sku, 0, 10000), 2))
	elapsed := time.Since(start)
	require.Equal(t, map[string]int{"HELD": 1, "SOLD_OUT": 9999}, outcomes(answers))
	a := audit(t, dep)
	require.Equal(t, 1, a.Active)
	require.Equal(t, 0, a.Available)
	require.Equal(t, 0, a.Drift())
	require.LessOrEqual(t, db.Stat().MaxConns(), int32(32))
	t.Logf("10,000 requests for 1 unit: HELD 1, SOLD_OUT 9999 in %v over at most %d connections", elapsed.Round(time.Millisecond), db.Stat().MaxConns())
}

// TestStrandedShare: the stock is split, so a node whose share is gone says
// SOLD_OUT while another node still has units. Not claimed
// (NoPhantomSoldOut); the audit shows the units left.
func TestStrandedShare(t *testing.T) {
	ctx := testCtx(t)
	dep, sku := deploy(t, freshDB(t), memquota.FromLog, 2, 4)
	got := outcomes(sendAll(ctx, dep, distinct("st", sku, 0, 3)))
	require.Equal(t, map[string]int{"HELD": 2, "SOLD_OUT": 1}, got)
	a := audit(t, dep)
	require.Equal(t, 2, a.Available, "node 1's share is still free")
	require.Equal(t, 2, a.Nodes[1].Available)
	require.Equal(t, 0, a.Drift())
}

// TestOpen: an invalid config or a known SKU writes nothing; deployments with
// disjoint SKUs share a database and each touches only its own rows.
func TestOpen(t *testing.T) {
	ctx := testCtx(t)
	db := freshDB(t)
	_, err := memquota.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: "x", Total: 1}}}, memquota.Options{Restart: 7})
	require.ErrorIs(t, err, strategy.ErrConfig)
	_, err = memquota.Open(ctx, strategy.Config{DB: db, Nodes: -1, Stock: []strategy.Stock{{SKU: "x", Total: 1}}}, memquota.Options{})
	require.ErrorIs(t, err, strategy.ErrConfig)

	a, skuA := deploy(t, db, memquota.FromConfig, 3, 10)
	fresh := newSKU("fresh")
	_, err = memquota.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: fresh, Total: 5}, {SKU: skuA, Total: 5}}}, memquota.Options{})
	require.ErrorIs(t, err, strategy.ErrStockExists)
	require.Contains(t, err.Error(), skuA)
	b, err := memquota.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: fresh, Total: 5}}}, memquota.Options{Restart: memquota.FromLog})
	require.NoError(t, err, "the refused Open wrote nothing for %s", fresh)
	defer b.Close()

	shares := audit(t, a).Nodes
	require.Equal(t, []int{4, 3, 3}, []int{shares[0].Share, shares[1].Share, shares[2].Share}, "strategy.ShareOf(10, 3, i)")

	ra, err := a.Node(2).Reserve(ctx, strategy.Request{Key: "a-" + skuA, User: "u", SKU: skuA, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, ra.Outcome)
	rb, err := b.Node(0).Reserve(ctx, strategy.Request{Key: "b-" + fresh, User: "u", SKU: fresh, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, strategy.OutcomeHeld, rb.Outcome)
	_, err = a.Node(0).Reserve(ctx, strategy.Request{Key: "a2-" + skuA, User: "u", SKU: fresh, TTL: time.Minute})
	require.ErrorIs(t, err, strategy.ErrBadRequest, "a deployment serves only its own SKUs")

	n, err := a.MakeDue(ctx, []string{"a-" + skuA, "b-" + fresh})
	require.NoError(t, err)
	require.Equal(t, 1, n, "MakeDue touches only the deployment's rows")
	n, err = b.MakeDue(ctx, []string{"b-" + fresh})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	units, err := a.Node(0).(strategy.Expirer).ExpireDue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, units, "ExpireDue of a expires only a's rows")
	require.Equal(t, 1, audit(t, b).Active)
	require.Equal(t, 10, audit(t, a).Available)
	require.Equal(t, 3, audit(t, a).Nodes[2].Available, "the unit went back to node 2, which sold it")
	require.PanicsWithError(t, fmt.Sprintf("%v: node 3 of a deployment with 3 nodes", strategy.ErrNodeRange), func() { a.Node(3) })
	require.ErrorIs(t, a.Restart(ctx, 3), strategy.ErrNodeRange)
}
