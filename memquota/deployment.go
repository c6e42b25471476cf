package memquota

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/pgstrategy"
)

//go:embed schema.sql
var schemaSQL string

// schema is strategy C's tables for pgstrategy: the advisory lock key that
// serialises their creation ("memquota" in ASCII), and memquota_sale_due,
// the last object of schema.sql.
// Every strategy declares its pgstrategy.Schema like this, with its own values.
var schema = pgstrategy.Schema{
	DDL:     schemaSQL,
	Last:    "memquota_sale_due",
	LockKey: 0x6d656d71756f7461,
	Totals:  `SELECT sku, total FROM memquota_stock WHERE sku = ANY($1)`,
	// Least privilege: stock and shares are written once at Open; the
	// sales log is inserted into and moved, never deleted from (the probe
	// that waits for a row in flight inserts and rolls back).
	Grants: []pgstrategy.Grant{
		{Table: "memquota_stock", Privileges: "SELECT, INSERT"},
		{Table: "memquota_share", Privileges: "SELECT, INSERT"},
		{Table: "memquota_sale", Privileges: "SELECT, INSERT, UPDATE"},
	},
}

// Deployment is strategy C over one database: its nodes, each with its own
// in-memory counters, and the durable sales log they share. All nodes live in
// this process, so a transition on any node gives the unit back to the
// counter of the node that sold it.
type Deployment struct {
	db    *pgxpool.Pool
	opts  Options
	skus  []string
	known pgstrategy.SKUs
	nodes []atomic.Pointer[node]

	// life orders restarts against everything that moves units between
	// memory and the log: a reserve (decrement, then insert), a session's
	// commit, a transition (update, then give back) hold it shared; Restart
	// holds it exclusively while it drops a node's counters and counts the
	// log, so no unit is in flight between the two while it counts.
	life sync.RWMutex

	// settleMu lets one goroutine at a time settle the units in doubt.
	settleMu sync.Mutex

	// The releases and expiries in doubt (moves.go).
	mmu    sync.Mutex
	moves  []moveDoubt
	nmoves atomic.Int32
	// counted numbers attempts when Options.AttemptsCounted is set.
	counted atomic.Int64

	closed atomic.Bool // Close was called: no restart any more
}

// Compile-time checks of what the package offers. Every strategy package has
// such a list, alike on purpose: it is the package's row of capabilities.
var (
	_ strategy.Deployment          = (*Deployment)(nil)
	_ strategy.Restarter           = (*Deployment)(nil)
	_ strategy.Ager                = (*Deployment)(nil)
	_ strategy.ReserveCrasher      = (*Deployment)(nil)
	_ strategy.Strategy            = (*node)(nil)
	_ strategy.Confirmer           = (*node)(nil)
	_ strategy.Releaser            = (*node)(nil)
	_ strategy.Expirer             = (*node)(nil)
	_ strategy.SessionOpener       = (*node)(nil)
	_ strategy.ExpirySessionOpener = (*node)(nil)
	_ strategy.Session             = (*session)(nil)
	_ strategy.ExpirySession       = (*session)(nil)
)

// Open deploys strategy C over cfg.DB: it validates cfg, then in one
// transaction creates the schema when missing and writes the stock and every
// node's share, and starts the nodes with their shares. A SKU that already
// has stock fails the whole Open with an error matching
// strategy.ErrStockExists, and nothing is written.
func Open(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := schema.Load(ctx, cfg, func(tx pgx.Tx) error { return writeStock(ctx, tx, cfg.Stock, cfg.NodeCount(), opts) }); err != nil {
		return nil, fmt.Errorf("memquota: open: %w", err)
	}
	return start(ctx, cfg, opts)
}

// attach is Meta.Attach. It writes nothing: the stock must be there
// already, with the same totals and number of nodes (else an error matching
// strategy.ErrConfig), and the nodes start as a restart would start them.
// They are a second process holding the same shares: from config, the
// whole shares again (an oversell waiting to happen, as in a restart).
func attach(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := schema.Attach(ctx, cfg); err != nil {
		return nil, fmt.Errorf("memquota: %w", err)
	}
	var sku string
	var nodes int
	err := cfg.DB.QueryRow(ctx, otherNodesSQL, cfg.SKUs(), cfg.NodeCount()).Scan(&sku, &nodes)
	switch {
	case err == nil:
		return nil, fmt.Errorf("memquota: attach: %w: sku %q is split over %d nodes, the config says %d",
			strategy.ErrConfig, sku, nodes, cfg.NodeCount())
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("memquota: attach: %w", err)
	}
	if opts.Restart == FromLog && !opts.AttachSkipsOrphans {
		// A predecessor that died may have left inserts at their COMMIT:
		// counted before they land, their units would be sold twice (the
		// kit's checkAttachBesideOrphan). Its units in doubt died with it,
		// so the successor waits for every statement writing to the log.
		if err := pgstrategy.AwaitWritersDone(ctx, cfg.DB, "memquota_sale"); err != nil {
			return nil, fmt.Errorf("memquota: attach: %w", err)
		}
	}
	return start(ctx, cfg, opts)
}

// otherNodesSQL finds a SKU whose stock is split over another number of
// nodes than $2.
const otherNodesSQL = `SELECT sku, nodes FROM memquota_stock WHERE sku = ANY($1) AND nodes <> $2 LIMIT 1`

// start builds the deployment over stock in the database and starts its
// nodes (Deployment.start).
func start(ctx context.Context, cfg strategy.Config, opts Options) (*Deployment, error) {
	n := cfg.NodeCount()
	d := &Deployment{
		db:    cfg.DB,
		opts:  opts,
		skus:  cfg.SKUs(),
		known: pgstrategy.NewSKUs(cfg),
		nodes: make([]atomic.Pointer[node], n),
	}
	for i := 0; i < n; i++ {
		nd, err := d.start(ctx, i, false)
		if err != nil {
			return nil, err
		}
		d.nodes[i].Store(nd)
	}
	return d, nil
}

// writeStock inserts the stock rows and the shares in tx. A SKU that exists
// already fails it, and the caller's transaction rolls everything back.
//
// opts carries the mistakes ZeroShareIsUnset and CeilShare.
func writeStock(ctx context.Context, tx pgx.Tx, stock []strategy.Stock, nodes int, opts Options) error {
	skus := make([]string, len(stock))
	totals := make([]int32, len(stock))
	var shareSKUs []string
	var shareNodes, shares []int32
	for i, s := range stock {
		skus[i], totals[i] = s.SKU, int32(s.Total)
		for n := 0; n < nodes; n++ {
			shareSKUs = append(shareSKUs, s.SKU)
			shareNodes = append(shareNodes, int32(n))
			share := s.Share(nodes, n)
			if opts.ZeroShareIsUnset && share == 0 {
				share = strategy.ShareOf(s.Total, nodes, n)
			}
			if opts.CeilShare && s.Shares == nil {
				ceil := (s.Total + nodes - 1) / nodes
				share = ceil
				if n == nodes-1 {
					share = max(0, s.Total-(nodes-1)*ceil)
				}
			}
			shares = append(shares, int32(share))
		}
	}
	rows, err := tx.Query(ctx, insertStockSQL, skus, totals, nodes)
	if err != nil {
		return fmt.Errorf("stock: insert: %w", err)
	}
	if err := pgstrategy.AllInserted(rows, skus); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, insertShareSQL, shareSKUs, shareNodes, shares); err != nil {
		return fmt.Errorf("shares: insert: %w", err)
	}
	return nil
}

const insertStockSQL = `
INSERT INTO memquota_stock (sku, total, nodes)
SELECT sku, total, $3 FROM unnest($1::text[], $2::int4[]) AS s (sku, total)
ON CONFLICT (sku) DO NOTHING
RETURNING sku`

const insertShareSQL = `
INSERT INTO memquota_share (sku, node, share)
SELECT * FROM unnest($1::text[], $2::int4[], $3::int4[])`

// startCountsSQL reads, for one node, its configured share of every SKU and
// the active sales it has logged ($3: Options.RecountSkipsDue's mistake;
// $4: Options.RecountRecentOnly's; $5: Options.RecountCountsExpired's).
const startCountsSQL = `
SELECT sh.sku, sh.share,
       (SELECT count(*) FROM memquota_sale s
         WHERE s.sku = sh.sku AND s.node = sh.node AND (s.status IN ('HELD', 'CONFIRMED') OR $5 AND s.status = 'EXPIRED')
           AND NOT ($3 AND s.status = 'HELD' AND s.expires_at < now())
           AND NOT ($4 AND s.created_at < now() - interval '48 hours'))
FROM memquota_share sh
WHERE sh.node = $1 AND sh.sku = ANY($2)`

// start builds node i with the counters the restart mode prescribes:
// FromConfig, the configured share; FromLog, the share minus the node's
// active rows in the sales log.
func (d *Deployment) start(ctx context.Context, i int, restart bool) (*node, error) {
	rows, err := d.db.Query(ctx, startCountsSQL, i, d.skus, restart && d.opts.RecountSkipsDue, restart && d.opts.RecountRecentOnly, restart && d.opts.RecountCountsExpired)
	if err != nil {
		return nil, fmt.Errorf("memquota: start node %d: %w", i, err)
	}
	defer rows.Close()
	nd := &node{d: d, id: i, counters: make(map[string]*counter, len(d.skus)), flights: map[string]*flight{}}
	for rows.Next() {
		var sku string
		var share int32
		var active int64
		if err := rows.Scan(&sku, &share, &active); err != nil {
			return nil, fmt.Errorf("memquota: start node %d: %w", i, err)
		}
		c := &counter{checkThenTake: d.opts.CheckThenTake}
		avail := int64(share)
		if d.opts.Restart == FromLog {
			if restart && d.opts.RecountEvenShare {
				avail = int64(strategy.ShareOf(d.known[sku], len(d.nodes), i))
			}
			avail = max(0, avail-active) // below 0 only after an oversell: nothing left to sell
		}
		c.n.Store(avail)
		nd.counters[sku] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("memquota: start node %d: %w", i, err)
	}
	if len(nd.counters) != len(d.skus) {
		return nil, fmt.Errorf("memquota: start node %d: %d of %d shares configured", i, len(nd.counters), len(d.skus))
	}
	return nd, nil
}

// startFromTotals is Options.RestartFallsBack's node: each counter the
// node's even split of its SKU's total, read from nothing.
func (d *Deployment) startFromTotals(i int) *node {
	nd := &node{d: d, id: i, counters: make(map[string]*counter, len(d.skus)), flights: map[string]*flight{}}
	for _, sku := range d.skus {
		c := &counter{checkThenTake: d.opts.CheckThenTake}
		c.n.Store(int64(strategy.ShareOf(d.known[sku], len(d.nodes), i)))
		nd.counters[sku] = c
	}
	return nd
}

// Node returns node i; out of range it panics (strategy.CheckNode).
func (d *Deployment) Node(i int) strategy.Strategy {
	strategy.CheckNode(i, len(d.nodes))
	return d.nodes[i].Load()
}

// Restart drops node i's in-memory counters and starts it again, as a
// process restart would, from what Options.Restart prescribes. It waits for
// the requests in flight (a request waits only for an attempt held open with
// its key or user), and the old node answers strategy.ErrNodeClosed from
// then on. Its attempts held open die with it: their Commit rolls back and
// returns strategy.ErrNodeClosed, so no attempt of the old process commits
// after the new one has counted the log. The node table is memquota's own,
// not pgstrategy.Handles: a restart here recounts memory from the log under
// the life lock, which a stateless node table has no place for.
func (d *Deployment) Restart(ctx context.Context, i int) error {
	if i < 0 || i >= len(d.nodes) {
		return fmt.Errorf("memquota: restart: %w: node %d of %d", strategy.ErrNodeRange, i, len(d.nodes))
	}
	if !d.opts.RestartWithoutDrain {
		d.life.Lock()
		defer d.life.Unlock()
	}
	if d.closed.Load() {
		return fmt.Errorf("memquota: restart node %d: %w", i, strategy.ErrNodeClosed)
	}
	if d.opts.Restart == FromLog && !d.opts.RestartSkipsOrphans {
		// The node's units in doubt are inserts whose client gave up: their
		// backends may still commit, after a recount that would count the
		// unit free (the kit's checkRestartBesideOrphan).
		// So may the backends of releases and expiries in doubt: one that
		// commits after the recount moved a row the recount counted HELD,
		// and settleMoves gives nothing to a node restarted since (outsider
		// round 38: the unit was lost).
		pids := d.nodes[i].Load().doubtPIDs()
		if !d.opts.RestartSkipsMoveOrphans {
			pids = append(pids, d.movePIDs()...)
		}
		if err := pgstrategy.AwaitBackendsDone(ctx, d.db, pids); err != nil {
			return fmt.Errorf("memquota: restart node %d: %w", i, err)
		}
	}
	nd, err := d.start(ctx, i, true)
	if err != nil && d.opts.RestartFallsBack {
		nd, err = d.startFromTotals(i), nil // the mistake
	}
	if err != nil {
		return err
	}
	if d.opts.RestartCarriesDoubts {
		prev := d.nodes[i].Load()
		prev.dmu.Lock()
		nd.doubts = append(nd.doubts, prev.doubts...)
		nd.ndoubt.Store(int32(len(nd.doubts)))
		prev.dmu.Unlock()
	}
	old := d.nodes[i].Swap(nd)
	old.MarkClosed()
	return nil
}

// Close marks every node closed. It drops no data and does not close the pool.
func (d *Deployment) Close() error {
	d.closed.Store(true)
	for i := range d.nodes {
		d.nodes[i].Load().MarkClosed()
	}
	return nil
}

// giveBack returns one unit of sku to the counter of node owner, the node
// that sold it.
func (d *Deployment) giveBack(owner int, sku string) {
	if owner < 0 || owner >= len(d.nodes) {
		return // not a node of this deployment: cannot happen for its SKUs
	}
	if c := d.nodes[owner].Load().counters[sku]; c != nil {
		c.put()
	}
}

const auditSQL = `
SELECT st.sku, st.total, sh.node, sh.share,
       count(s.request_key) FILTER (WHERE s.status IN ('HELD', 'CONFIRMED')),
       count(s.request_key)
FROM memquota_stock st
JOIN memquota_share sh ON sh.sku = st.sku
LEFT JOIN memquota_sale s ON s.sku = sh.sku AND s.node = sh.node
WHERE st.sku = ANY($1)
GROUP BY st.sku, st.total, sh.node, sh.share
ORDER BY st.sku, sh.node`

// Audit reports, per SKU of the deployment, the stock against the sales log:
// Total from the stock row, Available as the sum of the live nodes' counters,
// Active as the HELD and CONFIRMED rows of the log, and the same per node.
// The log is the truth: a negative drift (Available + Active > Total) is a
// unit counted twice, i.e. an oversell waiting to happen or done (a node
// restarted from its configured share); a positive drift is a unit lost from
// memory without a log row (a request that died between the decrement and
// the insert).
func (d *Deployment) Audit(ctx context.Context) ([]strategy.StockAudit, error) {
	rows, err := d.db.Query(ctx, auditSQL, d.skus)
	if err != nil {
		return nil, fmt.Errorf("memquota: audit: %w", err)
	}
	defer rows.Close()
	bySKU := make(map[string]*strategy.StockAudit, len(d.skus))
	for rows.Next() {
		var sku string
		var total, nodeID, share int32
		var active, sold int64
		if err := rows.Scan(&sku, &total, &nodeID, &share, &active, &sold); err != nil {
			return nil, fmt.Errorf("memquota: audit: %w", err)
		}
		a := bySKU[sku]
		if a == nil {
			a = &strategy.StockAudit{SKU: sku, Total: int(total)}
			bySKU[sku] = a
		}
		na := strategy.NodeAudit{Node: int(nodeID), Share: int(share), Active: int(active), Sold: int(sold)}
		if int(nodeID) < len(d.nodes) {
			if c := d.nodes[nodeID].Load().counters[sku]; c != nil {
				na.Available = int(c.n.Load())
			}
		}
		if d.opts.AuditFromLog {
			na.Available = max(0, na.Share-na.Active) // the mistake
		}
		a.Available += na.Available
		a.Active += na.Active
		a.Nodes = append(a.Nodes, na)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("memquota: audit: %w", err)
	}
	out := make([]strategy.StockAudit, 0, len(d.skus))
	for _, sku := range d.skus {
		a := bySKU[sku]
		if a == nil {
			return nil, fmt.Errorf("memquota: audit: no stock row for sku %q", sku)
		}
		out = append(out, *a)
	}
	return out, nil
}

const makeDueSQL = `
UPDATE memquota_sale SET expires_at = now() - interval '400 days', updated_at = now()
WHERE request_key = ANY($1) AND status = 'HELD' AND sku = ANY($2)`

// MakeDue moves expires_at of the deployment's HELD reservations with these
// keys into the past and returns how many it moved.
func (d *Deployment) MakeDue(ctx context.Context, keys []string) (int, error) {
	tag, err := d.db.Exec(ctx, makeDueSQL, keys, d.skus)
	if err != nil {
		return 0, fmt.Errorf("memquota: make due: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// settleSQL tells, for each unit in doubt, whether the backend that ran its
// insert is still there (its transaction may still commit) and whether the
// log has the row it inserted. A backend whose pid is gone has finished its
// transaction; a pid that is still there, or taken again, only delays the
// answer.
const settleSQL = `
SELECT k.ord,
       EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = k.pid),
       EXISTS (SELECT 1 FROM memquota_sale s WHERE s.request_key = k.key AND s.attempt = k.attempt)
FROM unnest($1::text[], $2::int4[], $3::int8[]) WITH ORDINALITY AS k (key, pid, attempt, ord)`

// Settle resolves the units in doubt: units taken from a counter for a
// sales-log row whose insert, or whose session's commit, failed without
// telling whether it committed (the connection broke, the server crashed,
// the deadline passed during COMMIT). Until then they are out of the counter
// and in no row the node knows of: the audit shows them as positive drift.
// Once the backend that ran the insert is gone, the log has the answer: the
// row is there (the unit is sold) or not (the unit goes back to the node's
// counter). A unit whose backend is still running stays in doubt. Settle
// returns the units it gave back.
//
// Nodes settle by themselves: the first request on any node after a unit
// fell in doubt settles the deployment's doubts first (a database outage
// ends with the first request that reaches the database again). A FromLog
// restart drops the node's doubts with the rest of its memory.
func (d *Deployment) Settle(ctx context.Context) (int, error) {
	d.life.RLock()
	defer d.life.RUnlock()
	d.settleMu.Lock()
	defer d.settleMu.Unlock()
	return d.settle(ctx)
}

// settleSome settles the doubts if there are any and no one else is
// settling. The caller holds d.life shared.
func (d *Deployment) settleSome(ctx context.Context) {
	pending := d.nmoves.Load() > 0
	for i := range d.nodes {
		if d.nodes[i].Load().ndoubt.Load() > 0 {
			pending = true
		}
	}
	if !pending || !d.settleMu.TryLock() {
		return
	}
	defer d.settleMu.Unlock()
	_, _ = d.settle(ctx) // the database may still be away: the next request tries again
}

// settle does Settle's work; the caller holds d.life shared and d.settleMu.
func (d *Deployment) settle(ctx context.Context) (int, error) {
	type pending struct {
		n *node
		doubt
	}
	var all []pending
	var keys []string
	var pids []int32
	var attempts []int64
	for i := range d.nodes {
		n := d.nodes[i].Load()
		n.dmu.Lock()
		for _, x := range n.doubts {
			all = append(all, pending{n, x})
			keys, pids, attempts = append(keys, x.key), append(pids, int32(x.pid)), append(attempts, x.attempt)
		}
		n.dmu.Unlock()
	}
	moved, err := d.settleMoves(ctx)
	if err != nil || len(all) == 0 {
		return moved, err
	}
	query := settleSQL
	if d.opts.SettleByKey {
		query = strings.Replace(query, " AND s.attempt = k.attempt", "", 1)
	}
	if d.opts.SettleActiveOnly {
		query = strings.Replace(query, " AND s.attempt = k.attempt", " AND s.attempt = k.attempt AND s.status IN ('HELD', 'CONFIRMED')", 1)
	}
	rows, err := d.db.Query(ctx, query, keys, pids, attempts)
	if err != nil {
		return 0, fmt.Errorf("memquota: settle: %w", err)
	}
	type verdict struct {
		Ord            int64
		Running, Found bool
	}
	verdicts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[verdict])
	if err != nil {
		return 0, fmt.Errorf("memquota: settle: %w", err)
	}
	back := moved
	for _, v := range verdicts {
		if v.Running && !d.opts.SettleWhileRunning {
			continue
		}
		p := all[v.Ord-1]
		p.n.dmu.Lock()
		for i, x := range p.n.doubts {
			if x.attempt == p.attempt {
				p.n.doubts = append(p.n.doubts[:i], p.n.doubts[i+1:]...)
				break
			}
		}
		p.n.ndoubt.Store(int32(len(p.n.doubts)))
		p.n.dmu.Unlock()
		if !v.Found {
			p.n.counters[p.sku].put()
			back++
		}
	}
	return back, nil
}
