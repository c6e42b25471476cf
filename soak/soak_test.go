package soak_test

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	_ "github.com/reservebench/reservebench/all"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/soak"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { strategytest.Main(m) }

// Environment of `make soak`.
const (
	envDuration = "RESERVEBENCH_SOAK"        // per strategy, e.g. "60s"; unset: the soak is skipped
	envSeed     = "RESERVEBENCH_SOAK_SEED"   // default: the time
	envReport   = "RESERVEBENCH_SOAK_REPORT" // default: ../docs/soak.md
	envOnly     = "RESERVEBENCH_SOAK_ONLY"   // a strategy's name: soak it alone
)

// TestSoak runs strategytest.Soak against every registered strategy, two at
// a time, each on a cluster of its own, and writes the report.
func TestSoak(t *testing.T) {
	d := os.Getenv(envDuration)
	if d == "" {
		t.Skipf("the soak runs for minutes: `make soak` (%s=60s)", envDuration)
	}
	dur, err := time.ParseDuration(d)
	if err != nil {
		t.Fatalf("%s=%q: %v", envDuration, d, err)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envSeed); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envSeed, s, err)
		}
	}
	t.Logf("soak: %v per strategy, seed %d", dur, seed)
	metas := strategy.Registered()
	if only := os.Getenv(envOnly); only != "" {
		m, ok := strategy.Lookup(only)
		if !ok {
			t.Fatalf("%s=%q: no such strategy", envOnly, only)
		}
		metas = []strategy.Meta{m}
	}
	run := &soak.Run{Duration: dur, Seed: seed, Reports: make([]*strategytest.SoakReport, len(metas)), Errors: map[string]string{}}
	start := time.Now()
	var mu sync.Mutex
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for i, meta := range metas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rep, version, err := soakOne(t, meta, dur, seed+uint64(i))
			mu.Lock()
			defer mu.Unlock()
			if version != "" {
				run.Server = version
			}
			if rep == nil {
				rep = &strategytest.SoakReport{Strategy: meta.Name, Seed: seed + uint64(i)}
			}
			run.Reports[i] = rep
			if err != nil {
				run.Errors[meta.Name] = err.Error()
			}
		}()
	}
	wg.Wait()
	run.Elapsed = time.Since(start)
	out := os.Getenv(envReport)
	if out == "" {
		out = "../docs/soak.md"
	}
	if err := os.WriteFile(out, run.Markdown(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s:\n%s", out, run.Markdown())
	for _, rep := range run.Reports {
		if rep.Result == nil {
			continue
		}
		for _, c := range rep.Result.Violations() {
			t.Error(rep.Result.Failure(c))
		}
	}
	for name, e := range run.Errors {
		t.Errorf("soak of %s could not run to its end: %s", name, e)
	}
}

// soakOne soaks one strategy on a cluster of its own.
func soakOne(t *testing.T, meta strategy.Meta, dur time.Duration, seed uint64) (*strategytest.SoakReport, string, error) {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		return nil, "", err
	}
	defer func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop %s's cluster: %v", meta.Name, err)
		}
	}()
	d, err := srv.CreateDatabase(ctx, "rb_soak")
	if err != nil {
		return nil, "", err
	}
	db, err := pgtest.OpenPool(ctx, d.DSN, 16)
	if err != nil {
		return nil, "", err
	}
	defer db.Close()
	defer strategytest.ForgetPools(db)
	admin, err := pgtest.OpenPool(ctx, d.AdminDSN, 4)
	if err != nil {
		return nil, "", err
	}
	defer admin.Close()
	logf := func(format string, args ...any) { t.Logf(meta.Name+": "+format, args...) }
	rep, err := strategytest.Soak(ctx, meta, strategytest.SoakOptions{Duration: dur, Seed: seed, DB: db, Admin: admin, Server: srv, Logf: logf})
	return rep, regexp.MustCompile(`^\d+`).FindString(srv.Version), err
}
