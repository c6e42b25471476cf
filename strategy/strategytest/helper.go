package strategytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/helperproc"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// The kill scenarios run a client in a helper process (the test binary,
// re-executed; see internal/helperproc): it attaches to the same stock
// (Meta.Attach), does its work inside a transaction held open, reports its
// stage and waits to be killed with SIGKILL. The helper finds the strategy
// by name, so a strategy that is not in strategy.Register's registry (a
// negative control, a variant) must be made findable with RegisterForHelpers.

// Kill points of the helper-process scenarios.
const (
	KillBefore      = "before"      // the transaction is open, nothing done yet
	KillUncommitted = "uncommitted" // the work is done inside it, not committed
)

const helperName = "strategytest-fault"

func init() { pgtest.RegisterHelper(helperName, faultHelper) }

// Main runs a test binary's tests and stops the throwaway PostgreSQL
// afterwards, and runs the kit's helper processes when the binary is
// re-executed as one. A package that runs the kit calls it from TestMain:
//
//	func TestMain(m *testing.M) { strategytest.Main(m) }
//
// It is pgtest.Main; either will do.
func Main(m *testing.M) { pgtest.Main(m) }

// helperMetas holds strategies that are not in strategy's registry (negative
// controls, variants) but must be found by name in a helper process.
var helperMetas sync.Map

// RegisterForHelpers makes a strategy that is not registered with
// strategy.Register findable by name in a helper process; call it from an
// init function of the test binary that runs the fault scenarios.
func RegisterForHelpers(m strategy.Meta) { helperMetas.Store(m.Name, m) }

func lookupMeta(name string) (strategy.Meta, bool) {
	if m, ok := strategy.Lookup(name); ok {
		return m, true
	}
	v, ok := helperMetas.Load(name)
	if !ok {
		return strategy.Meta{}, false
	}
	return v.(strategy.Meta), true
}

func helperCanFind(name string) bool { _, ok := lookupMeta(name); return ok }

// pgtestEnvDSN names the variable that points the tests at a server of the
// user's, for messages.
const pgtestEnvDSN = pgtest.EnvDSN

type helperArgs struct {
	Strategy  string             `json:"strategy"`
	DSN       string             `json:"dsn"`
	Stock     []strategy.Stock   `json:"stock"`
	Nodes     int                `json:"nodes"`
	Action    string             `json:"action"` // "expire" or "reserve"
	KillPoint string             `json:"kill_point"`
	Requests  []strategy.Request `json:"requests,omitempty"`
	// Resources are the addresses of what the strategy needs besides
	// PostgreSQL, as the parent's deployment has them.
	Resources map[strategy.Resource]string `json:"resources,omitempty"`
}

// faultHelper is the helper process's side.
func faultHelper() int {
	var a helperArgs
	return helperproc.Serve(&a, func() (string, error) { return helperWork(context.Background(), a) })
}

// helperWork attaches to the stock and does the work held open. A missing
// capability is reported as unsupported, never as a panic.
func helperWork(ctx context.Context, a helperArgs) (string, error) {
	meta, ok := lookupMeta(a.Strategy)
	if !ok {
		return "", helperproc.Unsupported(fmt.Sprintf("strategy %q is not registered in this test binary", a.Strategy))
	}
	if meta.Attach == nil {
		return "", helperproc.Unsupported("strategy does not implement Meta.Attach")
	}
	pool, err := pgtest.OpenPool(ctx, a.DSN, 8)
	if err != nil {
		return "", err
	}
	dep, err := meta.Attach(ctx, strategy.Config{DB: pool, Stock: a.Stock, Nodes: a.Nodes, Resources: a.Resources})
	if err != nil {
		return "", fmt.Errorf("attach: %w", err)
	}
	var details []string
	switch a.Action {
	case "expire":
		opener, ok := dep.Node(0).(strategy.ExpirySessionOpener)
		if !ok {
			return "", helperproc.Unsupported("strategy does not implement ExpirySessionOpener")
		}
		s, err := opener.OpenExpirySession(ctx)
		if err != nil {
			return "", fmt.Errorf("expiry session: %w", err)
		}
		if a.KillPoint == KillUncommitted {
			units, err := s.ExpireDue(ctx)
			if err != nil {
				return "", fmt.Errorf("expire: %w", err)
			}
			details = append(details, fmt.Sprintf("returned=%d", units))
		}
	case "reserve":
		opener, ok := dep.Node(0).(strategy.SessionOpener)
		if !ok {
			return "", helperproc.Unsupported("strategy does not implement SessionOpener")
		}
		// One transaction holds them all: a second attempt on the same SKU
		// would wait for the first in strategies that serialise per SKU.
		s, err := opener.OpenSession(ctx)
		if err != nil {
			return "", fmt.Errorf("session: %w", err)
		}
		for _, req := range a.Requests {
			if a.KillPoint == KillUncommitted {
				res, err := s.Reserve(ctx, req)
				if err != nil {
					return "", fmt.Errorf("reserve: %w", err)
				}
				details = append(details, string(res.Outcome))
			}
		}
	default:
		return "", fmt.Errorf("unknown action %q", a.Action)
	}
	return strings.TrimSpace(a.KillPoint + " " + strings.Join(details, " ")), nil
}

// helper is a running helper process and the application_name its
// backends carry.
type helper struct {
	*helperproc.Proc
	appName string
}

// spawnHelper starts the helper over this trial's stock and waits for its
// stage.
func (t *trial) spawnHelper(ctx context.Context, a helperArgs) (*helper, error) {
	appName := fmt.Sprintf("rb-fault-%s", strings.TrimPrefix(t.suffix, "-"))
	a.Strategy, a.Stock, a.Nodes, a.Resources = t.env.Meta.Name, t.cfg.Stock, t.cfg.NodeCount(), t.cfg.Resources
	a.DSN = pgcontrol.WithAppName(t.env.DB.Config().ConnString(), appName)
	p, err := helperproc.Start(ctx, helperName, a)
	if err != nil {
		return nil, err
	}
	return &helper{Proc: p, appName: appName}, nil
}

// isUnsupported reports whether err says the helper could not do the work.
func isUnsupported(err error) bool { return errors.Is(err, helperproc.ErrUnsupported) }
