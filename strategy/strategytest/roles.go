package strategytest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
)

// leastPriv is how a run serves a strategy: for one with Meta.Setup, the
// schema is created by an owner role (Setup, run once per scenario run) and
// every scenario serves as a runtime role that owns nothing (Env.DB is then
// a pool of that role); for one without, or where the server will not give
// the harness such roles, Env.DB serves as it is and why says so.
type leastPriv struct {
	owner       *pgxpool.Pool // nil: not served least-privileged
	ownerRole   string
	runtimeRole string
	why         string
}

// serveLeastPrivileged prepares env.lp unless a caller did, and points
// env.DB at the runtime role when the strategy can be served so. The roles
// come from pgtest.LeastPrivilege over env.Admin's DSN; a server whose admin
// role may not create roles (a RESERVEBENCH_DSN without CREATEROLE) runs the
// strategy as env.DB's role, and the least-privilege scenario says why it
// is skipped. The returned func closes what it opened.
func (env *Env) serveLeastPrivileged(ctx context.Context) (func(), error) {
	nothing := func() {}
	if env.lp != nil {
		return nothing, nil
	}
	if env.Meta.Setup == nil {
		env.lp = &leastPriv{why: "not least-privilege: Meta.Setup is nil, so Open creates its tables as the role it serves as, which owns them"}
		return nothing, nil
	}
	roles, err := pgtest.LeastPrivilege(ctx, env.Admin.Config().ConnString())
	if errors.Is(err, pgtest.ErrNotSupported) {
		env.lp = &leastPriv{why: "skipped: " + err.Error() + "; the strategy serves as the role it was given, which creates its tables"}
		return nothing, nil
	}
	if err != nil {
		return nil, err
	}
	owner, err := pgtest.OpenPool(ctx, roles.OwnerDSN, 2)
	if err != nil {
		return nil, err
	}
	if err := env.Meta.Setup(ctx, strategy.SetupConfig{Owner: owner, Runtime: roles.Runtime}); err != nil {
		owner.Close()
		return nil, fmt.Errorf("setup as %s: %w", pgtest.OwnerRole, err)
	}
	runtime, err := pgtest.OpenPool(ctx, roles.RuntimeDSN, env.DB.Config().MaxConns)
	if err != nil {
		owner.Close()
		return nil, err
	}
	env.DB = runtime
	env.lp = &leastPriv{owner: owner, ownerRole: pgtest.OwnerRole, runtimeRole: roles.Runtime}
	return func() { runtime.Close(); owner.Close() }, nil
}

// leastPrivilegeFor prepares the kit's database the way RunScenario
// prepares a run's (serveLeastPrivileged), once for all of Run's checks: it
// returns the pool the strategy serves with and how it is served.
func leastPrivilegeFor(t testing.TB, meta strategy.Meta, db, admin *pgxpool.Pool) (*pgxpool.Pool, *leastPriv) {
	t.Helper()
	env := Env{Meta: meta, DB: db, Admin: admin}
	closeRoles, err := env.serveLeastPrivileged(context.Background())
	if err != nil {
		t.Fatalf("least privilege: %v", err)
	}
	t.Cleanup(closeRoles)
	if env.lp.owner == nil {
		t.Logf("%s: %s", meta.Name, env.lp.why)
	}
	return env.DB, env.lp
}
