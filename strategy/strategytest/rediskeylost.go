package strategytest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// redisKeyLost: Redis keeps a key until it is deleted only while it evicts
// nothing. Given a maxmemory and an allkeys policy (allkeys-lru, the
// setting of many a shared cache), it evicts any key under memory
// pressure, while it runs, with no restart to recover from: the counter of
// a SKU whose units are out, or the marker of one held unit. A strategy
// that keeps state in Redis either asks for maxmemory-policy noeviction in
// its Meta.Needs (Open then refuses a Redis that may evict, and the check
// is not applicable), or survives the loss of any one of its keys.
// redis-restart loses every key at once and redis-jump only keys with a
// TTL: a give-back that finds its marker but no counter ran in no scenario
// (outsider round 37's m11rc2incrmissing: INCR of the missing counter made
// it 1, and the recount that would have made it 3 never ran).
//
// One round per key the strategy keeps for a SKU: on a SKU of its own of
// keyLostTotal units, two users hold a unit each; the keys whose names
// hold the SKU's (else those that appeared in Redis meanwhile) are the
// SKU's, in sorted order, and the round deletes the one of its index; then the first hold is released (or, without
// Release, the job runs), and new users ask until SOLD_OUT. At most
// keyLostTotal reservations may be active (no oversell), and the audit must
// show every unit in a reservation or available (conserves).
type redisKeyLost struct {
	twoClaims
	skipped string // why run skipped, for the second claim's verdict
}

// notRun says why the second claim has nothing to judge.
func (c *redisKeyLost) notRun() string {
	if c.skipped != "" {
		return c.skipped
	}
	return "no key of the strategy's Redis was lost"
}

// keyLostTotal is the stock of each round's SKU; keyLostMaxRounds bounds
// the rounds of a strategy that writes many keys per SKU.
const (
	keyLostTotal     = 4
	keyLostMaxRounds = 8
)

// noEviction is the Need setting that makes the check not applicable.
const noEviction = "maxmemory-policy noeviction"

func (c *redisKeyLost) run(t tester, meta strategy.Meta, db *pgxpool.Pool, res resourcetest.Set) {
	t.Helper()
	skip := func(why string) {
		c.skipped = why
		t.Skip(why)
	}
	srv, ok := res[strategy.Redis]
	switch {
	case !ok:
		skip("keeps nothing in Redis")
	case slices.Contains(strategy.SettingsOf(meta, strategy.Redis), noEviction):
		skip("asks its Redis for " + noEviction + ": a key is lost only with the others, by a restart (redis-restart)")
	case !srv.Controllable():
		skip("the strategy's Redis is an outside server (" + redistest.EnvAddr + "): the kit deletes no key it did not make")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opt, err := redis.ParseURL(srv.Addr())
	if err != nil {
		t.Fatalf("the strategy's Redis address: %v", err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	skus := make([]string, keyLostMaxRounds)
	stock := make([]strategy.Stock, keyLostMaxRounds)
	for i := range skus {
		skus[i] = kitSKU(fmt.Sprintf("key-lost-%d", i))
		stock[i] = strategy.Stock{SKU: skus[i], Total: keyLostTotal}
	}
	dep, err := meta.Open(ctx, strategy.Config{Resources: res.Addrs(), DB: db, Stock: stock})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	c.ran = true
	rounds := keyLostMaxRounds
	for round := 0; round < rounds; round++ {
		n := c.round(ctx, t, dep, node, rdb, skus[round], round)
		if round == 0 {
			rounds = min(n, keyLostMaxRounds)
			if n == 0 {
				t.Logf("no key appeared in the strategy's Redis while it held two units of a SKU: nothing of a SKU to lose")
			}
		}
	}
}

// round is one round on sku; it returns how many keys the SKU's holds
// wrote to Redis.
func (c *redisKeyLost) round(ctx context.Context, t tester, dep strategy.Deployment, node strategy.Strategy, rdb *redis.Client, sku string, round int) int {
	t.Helper()
	req := func(name string) strategy.Request {
		return strategy.Request{Key: "kit-key-lost-" + name + "-" + sku, User: "kit-key-lost-" + name, SKU: sku, TTL: time.Hour}
	}
	before, err := redisKeys(ctx, rdb)
	if err != nil {
		t.Fatalf("the keys of the strategy's Redis: %v", err)
	}
	for _, name := range []string{"a", "b"} {
		if res, err := reserveUnlessBusy(ctx, node, req(name)); err != nil || res.Outcome != strategy.OutcomeHeld {
			t.Fatalf("Reserve %s on a SKU of %d units: %s, %v; want HELD", req(name).Key, keyLostTotal, res.Outcome, err)
		}
	}
	after, err := redisKeys(ctx, rdb)
	if err != nil {
		t.Fatalf("the keys of the strategy's Redis: %v", err)
	}
	// The SKU's keys: those that name it (whenever they were written: a
	// counter may be loaded at Open), else those the holds wrote. Keys of
	// one naming sort alike for every SKU, so round i loses the same kind
	// of key on its own SKU.
	var written, named []string
	for k := range after {
		switch {
		case strings.Contains(k, sku):
			named = append(named, k)
		case !before[k]:
			written = append(written, k)
		}
	}
	if len(named) > 0 {
		written = named
	}
	slices.Sort(written)
	if round >= len(written) {
		return len(written)
	}
	lost := written[round]
	if err := rdb.Del(ctx, lost).Err(); err != nil {
		t.Fatalf("DEL %s: %v", lost, err)
	}
	what := fmt.Sprintf(" after the key %q, of the SKU's %d, was lost (as an eviction loses it)", lost, len(written))
	switch {
	case isReleaser(node):
		if n, err := node.(strategy.Releaser).Release(ctx, req("a").Key); err != nil {
			t.Fatalf("Release of the first hold%s: %v", what, err)
		} else if n != 1 {
			c.unconserved = append(c.unconserved, fmt.Sprintf("Release of the first hold%s gave back %d units; want 1", what, n))
		}
	case isExpirer(node):
		if ager, ok := dep.(strategy.Ager); ok {
			if _, err := ager.MakeDue(ctx, []string{req("a").Key}); err != nil {
				t.Fatalf("MakeDue: %v", err)
			}
			if _, err := node.(strategy.Expirer).ExpireDue(ctx); err != nil {
				t.Fatalf("ExpireDue%s: %v", what, err)
			}
		}
	}
	held := 0
	for i := range keyLostTotal + 1 {
		r := req(fmt.Sprintf("new-%d", i))
		res, err := reserveUnlessBusy(ctx, node, r)
		if err != nil {
			t.Fatalf("Reserve %s%s: %v", r.Key, what, err)
		}
		if res.Outcome == strategy.OutcomeSoldOut {
			break
		}
		if res.Outcome == strategy.OutcomeHeld {
			held++
		}
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	var mine []strategy.StockAudit
	for _, a := range list {
		if a.SKU == sku {
			mine = append(mine, a)
		}
	}
	c.audit(mine, fmt.Sprintf("%s (then %d new users HELD)", what, held))
	return len(written)
}

// redisKeys is the set of keys in the Redis of rdb.
func redisKeys(ctx context.Context, rdb *redis.Client) (map[string]bool, error) {
	out := map[string]bool{}
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, "*", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("SCAN: %w", err)
		}
		for _, k := range keys {
			out[k] = true
		}
		if next == 0 {
			return out, nil
		}
		cursor = next
	}
}
