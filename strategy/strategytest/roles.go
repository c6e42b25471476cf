package strategytest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

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
//
// The runtime pool is kept for the next run of the same strategy over the
// same Env.DB (a table runs every scenario over one pool, and a pool warms
// its connections once), until ForgetPools(env.DB).
func (env *Env) serveLeastPrivileged(ctx context.Context) (func(), error) {
	nothing := func() {}
	if env.lp != nil {
		return nothing, nil
	}
	if env.Meta.Setup == nil {
		env.lp = &leastPriv{why: "not least-privilege: Meta.Setup is nil, so Open creates its tables as the role it serves as, which owns them"}
		return nothing, nil
	}
	key := servedKey{db: env.DB, strategy: env.Meta.Name}
	if s, ok := served.Load(key); ok {
		env.DB, env.lp = s.(*servedAs).runtime, s.(*servedAs).lp
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
	lp := &leastPriv{owner: owner, ownerRole: pgtest.OwnerRole, runtimeRole: roles.Runtime}
	if _, raced := served.LoadOrStore(key, &servedAs{runtime: runtime, lp: lp}); raced {
		runtime.Close()
		owner.Close()
		return env.serveLeastPrivileged(ctx)
	}
	env.DB, env.lp = runtime, lp
	return nothing, nil
}

// served keeps the pools a strategy is served with, per Env.DB and
// strategy, across scenario runs.
var served sync.Map // servedKey -> *servedAs

type servedKey struct {
	db       *pgxpool.Pool
	strategy string
}

type servedAs struct {
	runtime *pgxpool.Pool
	lp      *leastPriv
}

// ForgetPools closes the pools RunScenario opened to serve strategies
// least-privileged over db (the runtime role's, the owner's), kept for the
// next run over db; call it before closing db. The kit and the table call
// it themselves.
func ForgetPools(db *pgxpool.Pool) {
	served.Range(func(k, v any) bool {
		if k.(servedKey).db == db {
			served.Delete(k)
			// A connection the strategy leaked never comes back; the
			// trial's check has said so (checkPoolReturned).
			_ = pgtest.CloseWithin(v.(*servedAs).runtime, 10*time.Second)
			v.(*servedAs).lp.owner.Close()
		}
		return true
	})
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
	t.Cleanup(func() { ForgetPools(db) })
	if env.lp.owner == nil {
		t.Logf("%s: %s", meta.Name, env.lp.why)
	}
	return env.DB, env.lp
}
