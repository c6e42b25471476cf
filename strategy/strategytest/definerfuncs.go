package strategytest

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
)

// A function declared SECURITY DEFINER runs with its owner's privileges,
// whoever calls it, and PostgreSQL lets PUBLIC execute every new function
// unless its creator revokes that. A restock function for an operator's
// console, created beside the schema and never revoked, hands any role of
// the cluster the UPDATE of the stock's total that the grants withhold from
// the runtime role: the table probes and the privilege ablation never see
// it, since it is no privilege on a table.

// definerFunction is one SECURITY DEFINER function of the strategy's
// schema and who may execute it.
type definerFunction struct {
	signature      string // regprocedure: name(argument types)
	public         bool   // PUBLIC holds EXECUTE
	runtime        bool   // the runtime role may execute it, by PUBLIC or its own grant
	runtimeGranted bool   // the runtime role holds EXECUTE in its own name
}

// checkDefinerFunctions fails for every SECURITY DEFINER function in
// schema public (but those of extensions) that PUBLIC may execute, and for
// every one the runtime role may execute without which the privilege
// workload answers the same: a function it never calls is power it only
// lends to whoever takes it over.
func (t *trial) checkDefinerFunctions(ctx context.Context, lp *leastPriv) error {
	rows, err := t.env.Admin.Query(ctx, `
		SELECT p.oid::regprocedure::text,
		       EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
		               WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'),
		       has_function_privilege($1, p.oid, 'EXECUTE'),
		       EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
		               WHERE a.grantee = (SELECT oid FROM pg_roles WHERE rolname = $1) AND a.privilege_type = 'EXECUTE')
		FROM pg_proc p
		WHERE p.prosecdef AND p.pronamespace = 'public'::regnamespace
		  AND NOT EXISTS (SELECT 1 FROM pg_depend d
		                  WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
		ORDER BY 1`, lp.runtimeRole)
	if err != nil {
		return fmt.Errorf("SECURITY DEFINER functions: %w", err)
	}
	funcs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (definerFunction, error) {
		var f definerFunction
		err := r.Scan(&f.signature, &f.public, &f.runtime, &f.runtimeGranted)
		return f, err
	})
	if err != nil {
		return fmt.Errorf("SECURITY DEFINER functions: %w", err)
	}
	var public []string
	for _, f := range funcs {
		if f.public {
			public = append(public, f.signature)
		}
	}
	t.check(strategy.LeastPrivilege, "PUBLIC may execute no SECURITY DEFINER function of the strategy's schema (it would run with its owner's privileges for any role)",
		len(public) == 0, fmt.Sprintf("EXECUTE to PUBLIC on %s", strings.Join(public, ", ")), noRequest)

	var callable []definerFunction
	for _, f := range funcs {
		// Held through membership of another role only: nothing here to
		// take away and give back.
		if f.runtime && (f.public || f.runtimeGranted) {
			callable = append(callable, f)
		}
	}
	if len(callable) == 0 {
		return nil
	}
	want, firstErr := t.privilegeWorkload(ctx, "definer-all")
	if firstErr != "" {
		t.check(Base, "with every function it may execute, the runtime role serves the privilege workload", false, firstErr, noRequest)
		return nil
	}
	var unused []string
	for i, f := range callable {
		got, why, err := t.withoutExecute(ctx, lp, f, fmt.Sprint("definer-", i))
		if err != nil {
			return err
		}
		if why == "" && slices.Equal(got, want) {
			unused = append(unused, f.signature)
		}
	}
	t.check(strategy.LeastPrivilege, "the runtime role may execute only the SECURITY DEFINER functions the strategy calls: without any one of them, a workload of every call answers otherwise or fails",
		len(unused) == 0, fmt.Sprintf("the same answers without EXECUTE on %s", strings.Join(unused, ", ")), noRequest)
	return nil
}

// withoutExecute runs the privilege workload with EXECUTE on f taken from
// PUBLIC and the runtime role, and gives back what it took whatever
// happens.
func (t *trial) withoutExecute(ctx context.Context, lp *leastPriv, f definerFunction, run string) (got []string, why string, err error) {
	var from []string
	if f.public {
		from = append(from, "PUBLIC")
	}
	if f.runtimeGranted {
		from = append(from, pgx.Identifier{lp.runtimeRole}.Sanitize())
	}
	grantees := strings.Join(from, ", ")
	return t.workloadRevoked(ctx, lp, "EXECUTE on "+f.signature,
		"REVOKE EXECUTE ON FUNCTION "+f.signature+" FROM "+grantees,
		"GRANT EXECUTE ON FUNCTION "+f.signature+" TO "+grantees, run)
}
