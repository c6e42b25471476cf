package main

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy"
)

// openResources provides what the strategy needs besides PostgreSQL (its
// Redis): the server RESERVEBENCH_REDIS names, else a throwaway one started
// for this process and stopped when it exits, as for PostgreSQL. Processes
// that attach to one stock must share their Redis, so -attach needs the
// environment's.
func openResources(ctx context.Context, cfg *serveConfig, logger *log.Logger) (resourcetest.Set, error) {
	needs := strategy.NeedsOf(cfg.meta)
	if len(needs) == 0 {
		return resourcetest.Set{}, nil
	}
	if cfg.attach && os.Getenv(redistest.EnvAddr) == "" {
		return nil, &UsageError{Flag: "attach", Reason: "needs " + redistest.EnvAddr + ": " + cfg.meta.Name + "'s counters or locks are in the Redis the first process used"}
	}
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	set, err := resourcetest.Start(startCtx, cfg.meta)
	if err != nil {
		return nil, err
	}
	for r, srv := range set {
		if os.Getenv(redistest.EnvAddr) != "" {
			logger.Printf("%s: the server %s names (%s)", r, redistest.EnvAddr, srv.Addr())
		} else {
			logger.Printf("%s: a throwaway server at %s, with the settings %s needs; stopped on exit", r, srv.Addr(), cfg.meta.Name)
		}
	}
	return set, nil
}
