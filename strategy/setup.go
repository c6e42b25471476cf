package strategy

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SetupConfig is what Meta.Setup needs: the schema is created as one role,
// served as another. Least privilege (seed 004): the role a strategy serves
// as owns nothing, so it cannot DROP, ALTER or TRUNCATE its tables, and holds
// only the privileges it uses (SELECT, INSERT, UPDATE on its tables, USAGE
// on its sequences); a strategy that needs more (DELETE, say) documents why
// in its Setup.
type SetupConfig struct {
	// Owner is a pool connected as the role that creates and owns the
	// schema. Setup is idempotent: deployments with disjoint SKUs share a
	// database, and Setup may run once per deployment.
	Owner *pgxpool.Pool
	// Runtime is the role Open and Attach will run as, to GRANT to.
	Runtime string
}

// Validate checks the config; every Meta.Setup calls it first.
func (c SetupConfig) Validate() error {
	if c.Owner == nil {
		return fmt.Errorf("%w: setup: no owner pool", ErrConfig)
	}
	if c.Runtime == "" {
		return fmt.Errorf("%w: setup: no runtime role", ErrConfig)
	}
	return nil
}
