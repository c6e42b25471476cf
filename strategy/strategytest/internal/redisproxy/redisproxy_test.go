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

// TestDroppedCommandNeverRuns: while a Drop is armed, a command that names
// the marker fails, its client's retries on new connections too, and the
// server never runs it; other commands pass; once stopped, it runs.
func TestDroppedCommandNeverRuns(t *testing.T) {
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
	opt.MaxRetries = 3
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	direct, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rdb.Del(ctx, "dropped", "passed").Err(); err != nil {
		t.Fatal(err)
	}
	dropped, stop := p.Drop("marker-2")
	if err := rdb.Set(ctx, "dropped", "marker-2", 0).Err(); err == nil {
		t.Fatal("SET naming the marker succeeded through an armed Drop; want an error")
	}
	select {
	case <-dropped:
	default:
		t.Fatal("dropped is not closed after a command naming the marker failed")
	}
	if err := rdb.Set(ctx, "passed", "other", 0).Err(); err != nil {
		t.Fatalf("SET not naming the marker: %v", err)
	}
	if n, err := direct.Exists(ctx, "dropped").Result(); err != nil || n != 0 {
		t.Fatalf("the dropped SET ran on the server (EXISTS %d, %v)", n, err)
	}
	stop()
	if err := rdb.Set(ctx, "dropped", "marker-2", 0).Err(); err != nil {
		t.Fatalf("SET naming the marker once the Drop stopped: %v", err)
	}
	if v, err := direct.Get(ctx, "dropped").Result(); err != nil || v != "marker-2" {
		t.Fatalf("after the Drop stopped: GET %q, %v", v, err)
	}
}
