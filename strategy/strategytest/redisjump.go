package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// redisJump: a strategy that keeps state in Redis keeps it for as long as
// the state is true, not for as long as a TTL guesses. A counter or a
// marker with a TTL ("keys of SKUs nobody sells any more fill Redis") is
// gone once a SKU sits quiet longer than that: a sold-out SKU whose
// reservations were paid (which touches only PostgreSQL) finds no counter
// and loads its whole stock again, and a hold released after its marker
// expired gives no unit back. No trial lasts longer than seconds, so no
// TTL ever runs out in one. Here the clock of the strategy's Redis jumps
// past every TTL (every key that has one is deleted, the others stay, and
// the holds are made due in PostgreSQL, as the same time would have made
// them); then the sold-out SKU must refuse, and the hold released after the
// jump must give its unit back.
type redisJump struct{ twoClaims }

func (j *redisJump) run(t tester, meta strategy.Meta, db *pgxpool.Pool, res resourcetest.Set) {
	t.Helper()
	srv, ok := res[strategy.Redis]
	if !ok {
		t.Skip("keeps nothing in Redis")
	}
	if !srv.Controllable() {
		t.Skip("the strategy's Redis is an outside server (" + redistest.EnvAddr + "): the kit deletes no key it did not make")
	}
	url, rs := srv.Addr(), res.Addrs()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	soldOut, released := kitSKU("redis-jump-sold-out"), kitSKU("redis-jump-released")
	const total = 2
	dep, err := meta.Open(ctx, strategy.Config{Resources: rs, DB: db, Stock: []strategy.Stock{{SKU: soldOut, Total: total}, {SKU: released, Total: 1}}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer dep.Close()
	node := dep.Node(0)
	ager, isAger := dep.(strategy.Ager)
	if !isAger {
		t.Skip("no MakeDue (strategy.Ager): the holds cannot be made as old as the jump")
	}
	req := func(sku string, i int) strategy.Request {
		return strategy.Request{Key: fmt.Sprintf("kit-jump-%d-%s", i, sku), User: fmt.Sprintf("kit-jump-%d", i), SKU: sku, TTL: time.Hour}
	}
	var held []string
	reserve := func(r strategy.Request, want strategy.Outcome) {
		t.Helper()
		res, err := reserveUnlessBusy(ctx, node, r)
		if err != nil || res.Outcome != want {
			t.Fatalf("Reserve key %q before the jump: %s, %v; want %s", r.Key, res.Outcome, err, want)
		}
		if want == strategy.OutcomeHeld {
			held = append(held, r.Key)
		}
	}
	for i := range total {
		reserve(req(soldOut, i), strategy.OutcomeHeld)
	}
	reserve(req(soldOut, total), strategy.OutcomeSoldOut)
	reserve(req(released, 0), strategy.OutcomeHeld)
	if c, ok := node.(strategy.Confirmer); ok { // paid: PostgreSQL only
		for i := range total {
			if moved, err := c.Confirm(ctx, req(soldOut, i).Key, strategy.ConfirmBeforeExpiry); err != nil || !moved {
				t.Fatalf("Confirm: %v, %v; want true", moved, err)
			}
		}
	}
	if _, err := ager.MakeDue(ctx, held); err != nil {
		t.Fatalf("MakeDue: %v", err)
	}
	deleted, err := jumpRedisClock(ctx, url)
	if err != nil {
		t.Fatalf("the jump of Redis's clock: %v", err)
	}
	t.Logf("Redis's clock jumped past every TTL: %d keys with one were deleted", len(deleted))
	jumped := fmt.Sprintf("after Redis's clock jumped past every TTL (%d keys: %s)", len(deleted), sample(deleted))
	j.ran = true
	for i := total + 1; i < 2*total+2; i++ {
		r := req(soldOut, i)
		if res, err := reserveUnlessBusy(ctx, node, r); err == nil && (res.Outcome == strategy.OutcomeHeld || res.Outcome == strategy.OutcomeReplay) {
			j.oversold = append(j.oversold, fmt.Sprintf("key %q for the sold-out SKU %s", r.Key, res.Outcome))
		}
	}
	gaveBack := false
	switch {
	case isReleaser(node):
		n, err := node.(strategy.Releaser).Release(ctx, req(released, 0).Key)
		if err != nil || n != 1 {
			j.unconserved = append(j.unconserved, fmt.Sprintf("Release of the due hold %s: %d, %v; want 1", jumped, n, err))
		}
		gaveBack = err == nil && n == 1
	case isExpirer(node):
		n, err := node.(strategy.Expirer).ExpireDue(ctx)
		if err != nil || n < 1 {
			j.unconserved = append(j.unconserved, fmt.Sprintf("ExpireDue of the due hold %s: %d, %v; want at least 1", jumped, n, err))
		}
		gaveBack = err == nil && n >= 1
	}
	list, err := dep.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	j.audit(list, fmt.Sprintf(" %s (the unit given back: %v)", jumped, gaveBack))
	if len(j.oversold) > 0 {
		j.oversold = append(j.oversold, jumped)
	}
}

func isReleaser(s strategy.Strategy) bool { _, ok := s.(strategy.Releaser); return ok }
func isExpirer(s strategy.Strategy) bool  { _, ok := s.(strategy.Expirer); return ok }

// jumpRedisClock deletes every key of the Redis at url that has a TTL, as
// the passing of a time longer than every TTL would, and returns them.
func jumpRedisClock(ctx context.Context, url string) ([]string, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	var deleted []string
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, "*", 1000).Result()
		if err != nil {
			return deleted, fmt.Errorf("SCAN: %w", err)
		}
		ttls := make([]*redis.DurationCmd, len(keys))
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				ttls[i] = p.PTTL(ctx, k)
			}
			return nil
		}); err != nil {
			return deleted, fmt.Errorf("PTTL: %w", err)
		}
		var expiring []string
		for i, k := range keys {
			if ttls[i].Val() > 0 { // -1: no TTL; -2: gone meanwhile
				expiring = append(expiring, k)
			}
		}
		if len(expiring) > 0 {
			if err := rdb.Del(ctx, expiring...).Err(); err != nil {
				return deleted, fmt.Errorf("DEL: %w", err)
			}
			deleted = append(deleted, expiring...)
		}
		if cursor = next; cursor == 0 {
			return deleted, nil
		}
	}
}
