package pgtest

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The least-privilege roles (seed 004). A strategy that separates creating
// its schema from serving (strategy.Meta.Setup) creates it as OwnerRole and
// serves as RuntimeRole, which owns nothing: it may connect and look up
// names in schema public, and holds only what Setup grants it. Neither may
// create databases or roles. AppRole stays what strategies that do not
// separate the two steps run as: it creates and owns its own tables.
const (
	OwnerRole   = "reservebench_owner"
	RuntimeRole = "reservebench_runtime"
)

// Roles are the DSNs of the least-privilege roles on one database.
type Roles struct {
	OwnerDSN   string
	RuntimeDSN string
	// Runtime is RuntimeRole, the role strategy.SetupConfig grants to.
	Runtime string
}

// LeastPrivilege prepares OwnerRole and RuntimeRole on the server and
// database adminDSN points at, and returns their DSNs: the roles are
// created once per server, and on the database OwnerRole may create in
// schema public while RuntimeRole may only use it (CREATE on public and
// TEMPORARY on the database are revoked from PUBLIC, as PostgreSQL 15 does
// for the first by default). adminDSN's role must be allowed to create
// roles and to grant on the database (a superuser, or a CREATEROLE role that
// owns the database, as pgtest's databases are owned by the role that
// created them). When it may not, or the server does not let the
// passwordless roles in, the error matches ErrNotSupported and says which.
func LeastPrivilege(ctx context.Context, adminDSN string) (Roles, error) {
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return Roles{}, fmt.Errorf("pgtest: least privilege: connect admin: %w", err)
	}
	defer admin.Close(ctx)
	for _, role := range []string{OwnerRole, RuntimeRole} {
		if err := createRole(ctx, admin, role); err != nil {
			return Roles{}, err
		}
	}
	var database string
	if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		return Roles{}, fmt.Errorf("pgtest: least privilege: %w", err)
	}
	db := pgx.Identifier{database}.Sanitize()
	owner, runtime := pgx.Identifier{OwnerRole}.Sanitize(), pgx.Identifier{RuntimeRole}.Sanitize()
	for _, stmt := range []string{
		"REVOKE TEMPORARY ON DATABASE " + db + " FROM PUBLIC",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT CONNECT ON DATABASE " + db + " TO " + owner + ", " + runtime,
		"GRANT USAGE, CREATE ON SCHEMA public TO " + owner,
		"GRANT USAGE ON SCHEMA public TO " + runtime,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" {
				return Roles{}, fmt.Errorf("%w: least privilege: the admin role may not %s (%s)", ErrNotSupported, stmt, pgErr.Message)
			}
			return Roles{}, fmt.Errorf("pgtest: least privilege: %s: %w", stmt, err)
		}
	}
	r := Roles{OwnerDSN: withUser(adminDSN, OwnerRole), RuntimeDSN: withUser(adminDSN, RuntimeRole), Runtime: RuntimeRole}
	for _, dsn := range []string{r.OwnerDSN, r.RuntimeDSN} {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return Roles{}, fmt.Errorf("%w: least privilege: the server does not let a passwordless role in: %v", ErrNotSupported, err)
		}
		_ = conn.Close(ctx)
	}
	return r, nil
}

// createRole creates a login role with no other attribute, unless it
// exists. A role that may not create roles gets ErrNotSupported.
func createRole(ctx context.Context, admin *pgx.Conn, role string) error {
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", role).Scan(&exists); err != nil {
		return fmt.Errorf("pgtest: look up role %s: %w", role, err)
	}
	if exists {
		return nil
	}
	_, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION")
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && (pgErr.Code == "42710" || pgErr.Code == "23505"):
		return nil // created meanwhile by a test process sharing the server
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return fmt.Errorf("%w: least privilege: the admin role may not create role %s (%s)", ErrNotSupported, role, pgErr.Message)
	}
	return fmt.Errorf("pgtest: create role %s: %w", role, err)
}
