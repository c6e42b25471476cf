package strategytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/nodeproc"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/pgcontrol"
)

// The node-process scenarios run each node of a deployment as an
// operating-system process (internal/nodeproc: the test binary, re-executed)
// that attaches to the trial's stock with Meta.Attach, as a real node
// starts, and serves only its own node; the harness talks to it over a
// pipe, SIGKILLs it, and starts it again. Seen from the harness, the
// processes together are one strategy.Deployment (nodeProcs), so the
// trial's history and audit are checked as every trial's are.

const nodeHelperName = "strategytest-node"

func init() { pgtest.RegisterHelper(nodeHelperName, nodeHelper) }

type nodeArgs struct {
	Strategy string           `json:"strategy"`
	DSN      string           `json:"dsn"`
	Stock    []strategy.Stock `json:"stock"`
	Nodes    int              `json:"nodes"`
	Node     int              `json:"node"`
	// Resources are the addresses of what the strategy needs besides
	// PostgreSQL (its Redis), as the trial's deployment has them.
	Resources map[strategy.Resource]string `json:"resources,omitempty"`
}

// nodeResult is a Reserve answer over the pipe.
type nodeResult struct {
	Result strategy.Result `json:"result"`
}

// nodeHelper is the node process's side: attach, then serve one node.
func nodeHelper() int {
	var a nodeArgs
	return nodeproc.Serve(&a, func() (nodeproc.Handler, error) {
		ctx := context.Background()
		meta, ok := lookupMeta(a.Strategy)
		if !ok || meta.Attach == nil {
			return nil, fmt.Errorf("strategy %q is not registered in this test binary, or has no Meta.Attach", a.Strategy)
		}
		pool, err := pgtest.OpenPool(ctx, a.DSN, 8)
		if err != nil {
			return nil, err
		}
		dep, err := meta.Attach(ctx, strategy.Config{DB: pool, Stock: a.Stock, Nodes: a.Nodes, Resources: a.Resources})
		if err != nil {
			return nil, fmt.Errorf("attach: %w", err)
		}
		return func(ctx context.Context, op string, arg json.RawMessage) (any, string, error) {
			return serveNode(ctx, dep, a.Node, op, arg)
		}, nil
	})
}

// serveNode answers one call for node i of dep.
func serveNode(ctx context.Context, dep strategy.Deployment, i int, op string, arg json.RawMessage) (any, string, error) {
	kind := func(err error) string {
		if errors.Is(err, strategy.ErrBadRequest) {
			return "bad_request"
		}
		return ""
	}
	switch op {
	case "reserve", "crash":
		var req strategy.Request
		if err := json.Unmarshal(arg, &req); err != nil {
			return nil, "", err
		}
		if op == "crash" {
			c, ok := dep.(strategy.ReserveCrasher)
			if !ok {
				return nil, "", errors.New("not a ReserveCrasher")
			}
			err := c.CrashMidReserve(ctx, i, req)
			return nil, kind(err), err
		}
		res, err := dep.Node(i).Reserve(ctx, req)
		return nodeResult{Result: res}, kind(err), err
	case "lookup":
		var key string
		if err := json.Unmarshal(arg, &key); err != nil {
			return nil, "", err
		}
		r, err := dep.Node(i).Lookup(ctx, key)
		return r, "", err
	case "release":
		var key string
		if err := json.Unmarshal(arg, &key); err != nil {
			return nil, "", err
		}
		rel, ok := dep.Node(i).(strategy.Releaser)
		if !ok {
			return nil, "", errors.New("not a Releaser")
		}
		n, err := rel.Release(ctx, key)
		return n, "", err
	case "audit":
		a, err := dep.Audit(ctx)
		return a, "", err
	}
	return nil, "", fmt.Errorf("unknown op %q", op)
}

// nodeProcs is the deployment the trial's node processes make together:
// process i serves node i. It implements strategy.Deployment for the
// harness; its nodes implement strategy.Releaser.
type nodeProcs struct {
	t     *trial
	mu    sync.Mutex
	procs []*nodeproc.Proc
	apps  []string // each process's application_name
	gen   int
}

var (
	_ strategy.Deployment = (*nodeProcs)(nil)
	_ strategy.Releaser   = procNode{}
)

// startNodeProcs replaces the trial's deployment by node processes, one per
// node; they are killed after the trial's final checks.
func (t *trial) startNodeProcs(ctx context.Context) (*nodeProcs, error) {
	np := &nodeProcs{t: t, procs: make([]*nodeproc.Proc, t.cfg.NodeCount()), apps: make([]string, t.cfg.NodeCount())}
	t.onCleanup(func() {
		np.mu.Lock()
		defer np.mu.Unlock()
		for _, p := range np.procs {
			if p != nil {
				p.Kill()
			}
		}
	})
	if err := t.dep.Close(); err != nil {
		return nil, fmt.Errorf("close the in-process deployment: %w", err)
	}
	t.dep = np
	for i := range np.procs {
		if err := np.start(ctx, i); err != nil {
			return nil, err
		}
	}
	return np, nil
}

// start starts node i's process (again), as Meta.Attach starts a node.
func (np *nodeProcs) start(ctx context.Context, i int) error {
	np.mu.Lock()
	np.gen++
	app := fmt.Sprintf("rb-node-%s-%d-%d", strings.TrimPrefix(np.t.suffix, "-"), i, np.gen)
	np.mu.Unlock()
	// A node process sends each statement in one round trip (pgx's exec
	// mode: parse, bind and execute together), so that a statement it had
	// sent before it was killed runs to its end whether or not its
	// connection had prepared it before: with prepared statements, one
	// that waited for a lock while being parsed would never be executed,
	// and what the table reports would depend on which connection a
	// request got.
	dsn := pgcontrol.WithAppName(np.t.env.DB.Config().ConnString(), app)
	if strings.Contains(dsn, "://") {
		dsn += "&default_query_exec_mode=exec"
	} else {
		dsn += " default_query_exec_mode=exec"
	}
	p, err := nodeproc.Start(ctx, nodeHelperName, nodeArgs{
		Strategy: np.t.env.Meta.Name, DSN: dsn,
		Stock: np.t.cfg.Stock, Nodes: np.t.cfg.NodeCount(), Node: i, Resources: np.t.cfg.Resources,
	})
	if err != nil {
		return fmt.Errorf("start node %d's process: %w", i, err)
	}
	np.mu.Lock()
	np.procs[i], np.apps[i] = p, app
	np.mu.Unlock()
	return nil
}

// kill SIGKILLs node i's process and waits until PostgreSQL has ended its
// backends. It reports whether the process died of SIGKILL.
func (np *nodeProcs) kill(ctx context.Context, i int) (bool, error) {
	np.mu.Lock()
	p, app := np.procs[i], np.apps[i]
	np.mu.Unlock()
	killed := p.Kill()
	return killed, pgcontrol.WaitBackendsGone(ctx, np.t.env.Admin, app)
}

// waitGone waits until PostgreSQL has ended the backends of node i's
// (killed) process.
func (np *nodeProcs) waitGone(ctx context.Context, i int) error {
	np.mu.Lock()
	app := np.apps[i]
	np.mu.Unlock()
	return pgcontrol.WaitBackendsGone(ctx, np.t.env.Admin, app)
}

func (np *nodeProcs) proc(i int) *nodeproc.Proc {
	np.mu.Lock()
	defer np.mu.Unlock()
	strategy.CheckNode(i, len(np.procs))
	return np.procs[i]
}

// call runs op on node i's process; an error of the node comes back as an
// error, ErrBadRequest-matching when the node refused the request.
func (np *nodeProcs) call(ctx context.Context, i int, op string, arg, result any) error {
	r, err := np.proc(i).Call(ctx, op, arg, result)
	if err != nil {
		return fmt.Errorf("node %d: %w", i, err)
	}
	if r.Err != "" {
		if r.Kind == "bad_request" {
			return fmt.Errorf("node %d: %w: %s", i, strategy.ErrBadRequest, r.Err)
		}
		return fmt.Errorf("node %d: %s", i, r.Err)
	}
	return nil
}

// Node returns a handle on node i's process, whichever is running when a
// call is made.
func (np *nodeProcs) Node(i int) strategy.Strategy {
	strategy.CheckNode(i, len(np.procs))
	return procNode{np: np, i: i}
}

// Audit asks every process. A strategy that breaks its audit down per node
// (counters in memory) has each node's counter read from that node's own
// process, which is the only one that holds it; any other is audited by
// node 0's process alone (its audit is the database's).
func (np *nodeProcs) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	audits := make([][]strategy.StockAudit, len(np.procs))
	for i := range np.procs {
		if err := np.call(ctx, i, "audit", nil, &audits[i]); err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
	}
	out := audits[0]
	for k := range out {
		if len(out[k].Nodes) == 0 {
			continue
		}
		out[k].Available = 0
		for i := range out[k].Nodes {
			own, err := nodeAudit(audits, k, out[k].SKU, out[k].Nodes[i].Node)
			if err != nil {
				return nil, err
			}
			out[k].Nodes[i].Available = own.Available
			out[k].Available += own.Available
		}
	}
	return out, nil
}

// nodeAudit is node n's part of the k-th SKU's audit as node n's process
// reports it.
func nodeAudit(audits [][]strategy.StockAudit, k int, sku string, n int) (strategy.NodeAudit, error) {
	if n < 0 || n >= len(audits) || k >= len(audits[n]) || audits[n][k].SKU != sku {
		return strategy.NodeAudit{}, fmt.Errorf("audit: node %d's process has no audit of %s", n, sku)
	}
	for _, na := range audits[n][k].Nodes {
		if na.Node == n {
			return na, nil
		}
	}
	return strategy.NodeAudit{}, fmt.Errorf("audit: node %d's process does not list its own node for %s", n, sku)
}

// Close does nothing: the processes are killed after the trial.
func (np *nodeProcs) Close() error { return nil }

// procNode is node i of nodeProcs.
type procNode struct {
	np *nodeProcs
	i  int
}

func (n procNode) Reserve(ctx context.Context, req strategy.Request) (strategy.Result, error) {
	var r nodeResult
	err := n.np.call(ctx, n.i, "reserve", req, &r)
	return r.Result, err
}

func (n procNode) Lookup(ctx context.Context, key string) (strategy.Reservation, error) {
	var r strategy.Reservation
	err := n.np.call(ctx, n.i, "lookup", key, &r)
	return r, err
}

func (n procNode) Release(ctx context.Context, key string) (int, error) {
	var units int
	err := n.np.call(ctx, n.i, "release", key, &units)
	return units, err
}
