package strategytest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
)

// The least-privilege claim is about what a runtime role that was taken
// over (an injection, a leaked DSN) can do. The probes of runLeastPrivilege
// ask for what it must never do; these two ask that it hold nothing more
// than the strategy uses:
//
//   - checkNoGrantOption: no privilege on the strategy's tables, sequences
//     or their columns is the runtime role's to grant on (WITH GRANT
//     OPTION would let it hand INSERT and UPDATE to any role), and none is
//     PUBLIC's;
//   - checkPrivilegesUsed: each privilege the runtime role holds on them is
//     taken away in turn, and a fresh deployment then serves a short
//     workload of every call (replay, conflicts, sold out, Confirm,
//     Release, the expiry job, Audit, Restart, Attach): the answers must differ
//     from those given with every privilege, or an error must say it was
//     needed. A privilege without which the strategy answers the same is
//     one it never uses (UPDATE on a stock row it only inserts, UPDATE on a
//     sequence it only draws from, which setval then rewinds).

// checkNoGrantOption fails for every privilege on the owner role's
// relations (and their columns) in schema public that the runtime role
// may grant on, or that PUBLIC holds.
func (t *trial) checkNoGrantOption(ctx context.Context, lp *leastPriv) error {
	rows, err := t.env.Admin.Query(ctx, `
		WITH owner AS (SELECT oid FROM pg_roles WHERE rolname = $1),
		     runtime AS (SELECT oid FROM pg_roles WHERE rolname = $2),
		     rels AS (SELECT c.oid, c.relname, c.relacl FROM pg_class c
		              WHERE c.relowner = (SELECT oid FROM owner) AND c.relnamespace = 'public'::regnamespace
		                AND c.relkind IN ('r', 'p', 'S', 'v', 'm')),
		     acl AS (
		       SELECT r.relname AS what, (aclexplode(r.relacl)).* FROM rels r
		       UNION ALL
		       SELECT r.relname || '.' || a.attname, (aclexplode(a.attacl)).*
		       FROM rels r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped)
		SELECT what || ': ' || privilege_type || CASE WHEN grantee = 0 THEN ' to PUBLIC' ELSE ' WITH GRANT OPTION' END
		FROM acl
		WHERE grantee = 0 OR (grantee = (SELECT oid FROM runtime) AND is_grantable)
		ORDER BY 1`, lp.ownerRole, lp.runtimeRole)
	if err != nil {
		return fmt.Errorf("grant options: %w", err)
	}
	wide, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("grant options: %w", err)
	}
	t.check(strategy.LeastPrivilege, "the runtime role may grant none of its privileges on, and PUBLIC holds none of, the strategy's tables and sequences", len(wide) == 0,
		fmt.Sprintf("%d: %s", len(wide), sample(wide)), noRequest)
	return nil
}

// relPrivilege is one privilege the runtime role holds on one relation.
type relPrivilege struct {
	rel, kind, privilege string
	column               string // "": the whole relation
}

func (p relPrivilege) String() string {
	if p.column != "" {
		return p.privilege + " on " + p.rel + "." + p.column
	}
	return p.privilege + " on " + p.rel
}

// statement is the GRANT or REVOKE of p for role.
func (p relPrivilege) statement(verb, role string) string {
	on, toFrom := "TABLE", "TO"
	if p.kind == "S" {
		on = "SEQUENCE"
	}
	if verb == "REVOKE" {
		toFrom = "FROM"
	}
	priv := p.privilege
	if p.column != "" {
		priv += " (" + pgx.Identifier{p.column}.Sanitize() + ")"
	}
	return fmt.Sprintf("%s %s ON %s %s %s %s", verb, priv, on, pgx.Identifier{p.rel}.Sanitize(), toFrom, pgx.Identifier{role}.Sanitize())
}

// checkPrivilegesUsed takes away each table, column or sequence privilege
// of the runtime role in turn (as the owner), runs privilegeWorkload, and gives it
// back. The run's other cells of this strategy never run beside it (one
// cell of a strategy at a time), so nothing else meets the missing
// privilege.
func (t *trial) checkPrivilegesUsed(ctx context.Context, lp *leastPriv) error {
	rows, err := t.env.Admin.Query(ctx, `
		WITH rels AS (SELECT c.oid, c.relname, c.relkind, c.relacl FROM pg_class c
		              WHERE c.relowner = (SELECT oid FROM pg_roles WHERE rolname = $1) AND c.relnamespace = 'public'::regnamespace
		                AND c.relkind IN ('r', 'p', 'S')),
		     runtime AS (SELECT oid FROM pg_roles WHERE rolname = $2)
		SELECT r.relname, r.relkind::text, a.privilege_type, ''
		FROM rels r, aclexplode(r.relacl) a WHERE a.grantee = (SELECT oid FROM runtime)
		UNION ALL
		SELECT r.relname, r.relkind::text, a.privilege_type, att.attname::text
		FROM rels r JOIN pg_attribute att ON att.attrelid = r.oid AND att.attnum > 0 AND NOT att.attisdropped,
		     aclexplode(att.attacl) a WHERE a.grantee = (SELECT oid FROM runtime)
		ORDER BY 1, 4, 3`, lp.ownerRole, lp.runtimeRole)
	if err != nil {
		return fmt.Errorf("privileges: %w", err)
	}
	held, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (relPrivilege, error) {
		var p relPrivilege
		err := r.Scan(&p.rel, &p.kind, &p.privilege, &p.column)
		return p, err
	})
	if err != nil {
		return fmt.Errorf("privileges: %w", err)
	}
	want, firstErr := t.privilegeWorkload(ctx, "all")
	if firstErr != "" {
		t.check(Base, "with every privilege it was granted, the runtime role serves the privilege workload", false, firstErr, noRequest)
		return nil
	}
	var unused, used []string
	for i, p := range held {
		got, why, err := t.withoutPrivilege(ctx, lp, p, fmt.Sprint(i))
		if err != nil {
			return err
		}
		if why == "" && slices.Equal(got, want) {
			unused = append(unused, p.String())
		} else {
			used = append(used, p.String())
		}
	}
	t.fact("privileges the workload needs", "%d of %d: %s", len(used), len(held), strings.Join(used, ", "))
	t.check(strategy.LeastPrivilege, "the runtime role holds only privileges the strategy uses: without any one of them, a workload of every call answers otherwise or fails", len(unused) == 0,
		fmt.Sprintf("the same answers without %s", strings.Join(unused, ", ")), noRequest)
	return nil
}

// withoutPrivilege runs the workload with p revoked, and grants it back
// whatever happens.
func (t *trial) withoutPrivilege(ctx context.Context, lp *leastPriv, p relPrivilege, run string) (got []string, why string, err error) {
	return t.workloadRevoked(ctx, lp, p.String(), p.statement("REVOKE", lp.runtimeRole), p.statement("GRANT", lp.runtimeRole), run)
}

// workloadRevoked runs revoke as the owner, the privilege workload, and
// grant whatever happens (what names the privilege in errors).
func (t *trial) workloadRevoked(ctx context.Context, lp *leastPriv, what, revoke, grant, run string) (got []string, why string, err error) {
	if _, err := lp.owner.Exec(ctx, revoke); err != nil {
		return nil, "", fmt.Errorf("revoke %s: %w", what, err)
	}
	defer func() {
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, gerr := lp.owner.Exec(gctx, grant); gerr != nil && err == nil {
			err = fmt.Errorf("grant %s back: %w", what, gerr)
		}
	}()
	got, why = t.privilegeWorkload(ctx, run)
	return got, why, nil
}

// privilegeWorkload opens a deployment of two kit SKUs (2 units and 1) and
// makes every call once (Attach too), returning its answers (without names, so that runs
// compare) and the first error, which a call without its privilege meets.
func (t *trial) privilegeWorkload(ctx context.Context, run string) ([]string, string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	base := kitSKU("priv-" + run)
	a, b := base+"-a", base+"-b"
	var out []string
	firstErr := ""
	note := func(what string, answer any, err error) {
		if err != nil {
			answer = "error"
			if firstErr == "" {
				firstErr = what + ": " + err.Error()
			}
		}
		out = append(out, fmt.Sprintf("%s: %v", what, answer))
	}
	cfg := strategy.Config{Resources: t.env.Resources.Addrs(), DB: t.env.DB, Stock: []strategy.Stock{{SKU: a, Total: 2}, {SKU: b, Total: 1}}}
	dep, err := t.env.Meta.Open(ctx, cfg)
	if err != nil {
		note("open", nil, err)
		return out, firstErr
	}
	defer dep.Close()
	node := dep.Node(0)
	key := func(n int) string { return fmt.Sprintf("kit-priv-%d-%s", n, base) }
	user := func(n int) string { return fmt.Sprintf("kit-priv-user-%d", n) }
	reserve := func(what string, k, u int, sku string) {
		res, err := node.Reserve(ctx, strategy.Request{Key: key(k), User: user(u), SKU: sku, TTL: time.Hour})
		note(what, res.Outcome, err)
	}
	reserve("reserve", 1, 1, a)
	reserve("the same request again", 1, 1, a)
	reserve("its key by another user", 1, 2, a)
	reserve("its user with another key", 2, 1, a)
	reserve("another user", 3, 2, a)
	reserve("a third user, sold out", 4, 3, a)
	reserve("the other SKU", 5, 1, b)
	look := func(what string, k int) {
		r, err := node.Lookup(ctx, key(k))
		note(what, r.Status, err)
	}
	look("lookup", 1)
	look("lookup of an unknown key", 9)
	if c, ok := node.(strategy.Confirmer); ok {
		moved, err := c.Confirm(ctx, key(1), strategy.ConfirmUntilExpired)
		note("confirm", moved, err)
	}
	if r, ok := node.(strategy.Releaser); ok {
		n, err := r.Release(ctx, key(3))
		note("release", n, err)
	}
	ager, isAger := dep.(strategy.Ager)
	if e, ok := node.(strategy.Expirer); ok && isAger {
		n, err := ager.MakeDue(ctx, []string{key(5)})
		note("make due", n, err)
		units, err := e.ExpireDue(ctx)
		note("expire due", units, err)
	}
	list, err := dep.Audit(ctx)
	note("audit", auditShape(list, a, b), err)
	if r, ok := dep.(strategy.Restarter); ok {
		err := r.Restart(ctx, 0)
		note("restart", "done", err)
		node = dep.Node(0)
		reserve("after the restart, a fourth user", 6, 4, a)
		look("after the restart, lookup", 1)
	}
	if t.env.Meta.Attach != nil {
		// A second process of the service: what it reads to start.
		other, err := t.env.Meta.Attach(ctx, cfg)
		note("attach", "done", err)
		if err == nil {
			r, err := other.Node(0).Lookup(ctx, key(1))
			note("lookup through the attached process", r.Status, err)
			_ = other.Close()
		}
	}
	return out, firstErr
}

// auditShape is an audit without the SKUs' names.
func auditShape(list []strategy.StockAudit, a, b string) string {
	var parts []string
	for _, r := range list {
		name := "?"
		switch r.SKU {
		case a:
			name = "a"
		case b:
			name = "b"
		}
		parts = append(parts, fmt.Sprintf("%s %d/%d/%d", name, r.Total, r.Available, r.Active))
	}
	return strings.Join(parts, ", ")
}
