package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// twoClaims is what a check judged under two claims found: sales past a
// total (no-oversell) and units lost or kept (conserves). Its run records
// both; deployment-contract judges each in a part of its own claim.
type twoClaims struct {
	ran                   bool
	oversold, unconserved []string
}

// audit sorts an audit's findings: more active than the total is an
// oversell, any other drift a unit lost or kept. note follows each SKU.
func (c *twoClaims) audit(list []strategy.StockAudit, note string) {
	for _, a := range list {
		switch {
		case a.Active > a.Total:
			c.oversold = append(c.oversold, fmt.Sprintf("audit of %s%s: %d active of %d", a.SKU, note, a.Active, a.Total))
		case a.Drift() != 0:
			c.unconserved = append(c.unconserved, fmt.Sprintf("audit of %s%s: total %d, available %d, active %d", a.SKU, note, a.Total, a.Available, a.Active))
		}
	}
}

// judge fails t with list, or skips when the run did not get that far.
func (c *twoClaims) judge(t tester, list []string, what, notRun string) {
	t.Helper()
	if !c.ran {
		t.Skip(notRun)
	}
	if len(list) > 0 {
		t.Errorf("%s: %s", what, strings.Join(list, "; "))
	}
}

// emptyDatabase creates a database with nothing in it on admin's server
// and returns the configuration of a pool on it (admin's role) and the
// function that drops it. An admin that may not create one (an outside
// server, RESERVEBENCH_DSN) skips the check, which names itself in what.
func emptyDatabase(ctx context.Context, t tester, admin *pgxpool.Pool, prefix, what string) (*pgxpool.Config, func()) {
	t.Helper()
	name := prefix + "_" + randomID() // [a-z0-9_]: no quoting needed
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege {
			t.Skip("the admin role may not create a database (an outside server, RESERVEBENCH_DSN): " + what + " not checked")
		}
		t.Fatalf("create an empty database: %v", err)
	}
	cfg := admin.Config().Copy()
	cfg.ConnConfig.Database = name
	return cfg, func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop the empty database %s: %v", name, err)
		}
	}
}
