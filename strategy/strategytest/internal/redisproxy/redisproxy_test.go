package redisproxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/redisproxy"
)

// TestHeldCommandRunsAfterALaterOne: the command that names the marker is
// held; one sent after it on another connection runs first; let go, the
// held one runs, and its client gets its answer.
func TestHeldCommandRunsAfterALaterOne(t *testing.T) {
	srv := redistest.New(t)
	p, err := redisproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	opt, err := redis.ParseURL(p.URL())
	if err != nil {
		t.Fatal(err)
	}
	opt.ReadTimeout = 30 * time.Second
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rdb.Del(ctx, "order").Err(); err != nil {
		t.Fatal(err)
	}
	held, letGo := p.Hold("marker-1")
	first := make(chan error, 1)
	go func() { first <- rdb.RPush(ctx, "order", "marker-1").Err() }()
	<-held
	if err := rdb.RPush(ctx, "order", "second").Err(); err != nil {
		t.Fatal(err)
	}
	letGo()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	got, err := rdb.LRange(ctx, "order", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != "second" || got[1] != "marker-1" {
		t.Fatalf("order %v, want [second marker-1]", got)
	}
}
