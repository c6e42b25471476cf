package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
)

// database is where serve keeps its stock: the server RESERVEBENCH_DSN
// names, or a throwaway one it started and stops again.
type database struct {
	pool *pgxpool.Pool
	own  *pgtest.Server // nil for a server named by RESERVEBENCH_DSN
}

func openDatabase(ctx context.Context, cfg *serveConfig, logger *log.Logger) (*database, error) {
	if dsn := os.Getenv(pgtest.EnvDSN); dsn != "" {
		pool, err := pgtest.OpenPool(ctx, dsn, cfg.pool)
		if err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pgtest.EnvDSN, err)
		}
		logger.Printf("PostgreSQL: the database %s names (%d connections)", pgtest.EnvDSN, cfg.pool)
		return &database{pool: pool}, nil
	}
	if cfg.attach {
		return nil, &UsageError{Flag: "attach", Reason: "needs " + pgtest.EnvDSN + ": the stock another process loaded is in the database it names"}
	}
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(startCtx, pgtest.Options{})
	if err != nil {
		return nil, err
	}
	d, err := srv.CreateDatabase(startCtx, "rb_serve")
	if err != nil {
		_ = srv.Stop()
		return nil, err
	}
	pool, err := pgtest.OpenPool(startCtx, d.DSN, cfg.pool)
	if err != nil {
		_ = srv.Stop()
		return nil, err
	}
	where := "a throwaway " + string(srv.Kind) + " server"
	if dir := srv.Dir(); dir != "" {
		where += " in " + dir
	}
	logger.Printf("PostgreSQL %s: %s, stopped and removed on exit; psql %q", srv.Version, where, d.AdminDSN)
	return &database{pool: pool, own: srv}, nil
}

func (d *database) close(logger *log.Logger) {
	d.pool.Close()
	if d.own != nil {
		if err := d.own.Stop(); err != nil {
			logger.Printf("stop the throwaway server: %v", err)
		}
	}
}
