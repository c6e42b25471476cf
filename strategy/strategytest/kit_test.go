package strategytest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The fakes below exist to prove the kit: the correct one passes it, the
// broken one (no key dedup, no per-user limit) must fail it. They keep
// everything in memory and ignore the database except as an identity.

var fakeStores sync.Map // *pgxpool.Pool -> *fakeStore

type fakeStore struct {
	mu     sync.Mutex
	broken bool
	stock  map[string]*fakeStock
	rows   []*strategy.Reservation // in insertion order; the broken fake may hold a key twice
}

type fakeStock struct{ total, available int }

func fakeMeta(name string, broken bool) strategy.Meta {
	return strategy.Meta{
		Name:        name,
		Description: "in-memory fake that proves the conformance kit",
		Claims:      strategy.NoOversell | strategy.IdempotentKey | strategy.OneActivePerUser | strategy.ReturnOnce | strategy.Conserves | strategy.NoPhantomSoldOut | strategy.SurvivesRestart,
		Open: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			return fakeOpen(cfg, broken, false)
		},
		Attach: func(ctx context.Context, cfg strategy.Config) (strategy.Deployment, error) {
			return fakeOpen(cfg, broken, true)
		},
	}
}

func fakeOpen(cfg strategy.Config, broken, attach bool) (strategy.Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v, _ := fakeStores.LoadOrStore(cfg.DB, &fakeStore{stock: map[string]*fakeStock{}})
	st := v.(*fakeStore)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.broken = broken
	if attach {
		for _, s := range cfg.Stock {
			if st.stock[s.SKU] == nil || st.stock[s.SKU].total != s.Total {
				return nil, fmt.Errorf("%w: attach: no stock of %d for %s", strategy.ErrConfig, s.Total, s.SKU)
			}
		}
		return &fakeDeployment{store: st, skus: cfg.SKUs(), nodes: cfg.NodeCount(), epoch: map[int]int{}}, nil
	}
	for _, s := range cfg.Stock {
		if st.stock[s.SKU] != nil {
			return nil, fmt.Errorf("%w: %s", strategy.ErrStockExists, s.SKU)
		}
	}
	for _, s := range cfg.Stock {
		st.stock[s.SKU] = &fakeStock{total: s.Total, available: s.Total}
	}
	return &fakeDeployment{store: st, skus: cfg.SKUs(), nodes: cfg.NodeCount(), epoch: map[int]int{}}, nil
}

type fakeDeployment struct {
	store  *fakeStore
	skus   []string
	nodes  int
	epoch  map[int]int // restarts per node, under store.mu
	closed bool        // under store.mu
}

func (d *fakeDeployment) Node(i int) strategy.Strategy {
	strategy.CheckNode(i, d.nodes)
	d.store.mu.Lock()
	defer d.store.mu.Unlock()
	return &fakeNode{d: d, node: i, epoch: d.epoch[i]}
}

// Restart gives node i a new epoch: the old handle answers ErrNodeClosed.
func (d *fakeDeployment) Restart(_ context.Context, i int) error {
	if i < 0 || i >= d.nodes {
		return fmt.Errorf("fake: restart: %w: node %d of %d", strategy.ErrNodeRange, i, d.nodes)
	}
	d.store.mu.Lock()
	defer d.store.mu.Unlock()
	d.epoch[i]++
	return nil
}

func (d *fakeDeployment) Close() error {
	d.store.mu.Lock()
	defer d.store.mu.Unlock()
	d.closed = true
	return nil
}

// gone reports whether the node was restarted or its deployment closed;
// store.mu is held.
func (n *fakeNode) gone() bool { return n.d.closed || n.d.epoch[n.node] != n.epoch }

// check is gone as the error a closed node answers.
func (n *fakeNode) check() error {
	n.d.store.mu.Lock()
	defer n.d.store.mu.Unlock()
	if n.gone() {
		return strategy.ErrNodeClosed
	}
	return nil
}

func (d *fakeDeployment) Audit(context.Context) ([]strategy.StockAudit, error) {
	s := d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []strategy.StockAudit
	for _, sku := range d.skus {
		a := strategy.StockAudit{SKU: sku, Total: s.stock[sku].total, Available: s.stock[sku].available}
		for _, r := range s.rows {
			if r.SKU == sku && r.Status.Active() {
				a.Active++
			}
		}
		out = append(out, a)
	}
	return out, nil
}

func (d *fakeDeployment) MakeDue(_ context.Context, keys []string) (int, error) {
	s := d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		for _, r := range s.rows {
			if r.Key == k && r.Status == strategy.StatusHeld && slices.Contains(d.skus, r.SKU) {
				r.ExpiresAt = time.Now().Add(-400 * 24 * time.Hour) // strategy.Ager: 400 days back
				n++
				break
			}
		}
	}
	return n, nil
}

type fakeNode struct {
	d     *fakeDeployment
	node  int
	epoch int
}

func (n *fakeNode) Reserve(_ context.Context, req strategy.Request) (strategy.Result, error) {
	if err := req.Validate(); err != nil {
		return strategy.BadRequest(err)
	}
	s := n.d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	if n.gone() {
		return strategy.Result{}, strategy.ErrNodeClosed
	}
	stock := s.stock[req.SKU]
	if stock == nil || !slices.Contains(n.d.skus, req.SKU) {
		return strategy.BadRequest(strategy.UnknownSKU(req.SKU))
	}
	if !s.broken {
		for _, r := range s.rows {
			if r.Key == req.Key {
				if r.User != req.User || r.SKU != req.SKU {
					return strategy.Result{Outcome: strategy.OutcomeKeyReused, Reservation: *r}, nil
				}
				return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: *r}, nil
			}
		}
		for _, r := range s.rows {
			if r.User == req.User && r.SKU == req.SKU && r.Status.Active() {
				return strategy.Result{Outcome: strategy.OutcomeUserLimit}, nil
			}
		}
	}
	if stock.available == 0 {
		return strategy.Result{Outcome: strategy.OutcomeSoldOut}, nil
	}
	stock.available--
	r := &strategy.Reservation{Key: req.Key, User: req.User, SKU: req.SKU, Status: strategy.StatusHeld, ExpiresAt: time.Now().Add(req.TTL)}
	s.rows = append(s.rows, r)
	return strategy.Result{Outcome: strategy.OutcomeHeld, Reservation: *r}, nil
}

func (n *fakeNode) Lookup(_ context.Context, key string) (strategy.Reservation, error) {
	if err := n.check(); err != nil {
		return strategy.Reservation{}, err
	}
	s := n.d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.Key == key {
			return *r, nil
		}
	}
	return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, nil
}

func (n *fakeNode) move(key string, to strategy.Status, due bool) int {
	s := n.d.store
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.Key == key && slices.Contains(n.d.skus, r.SKU) && r.Status == strategy.StatusHeld && (!due || r.ExpiresAt.Before(time.Now())) {
			r.Status = to
			if to != strategy.StatusConfirmed {
				s.stock[r.SKU].available++
			}
			return 1
		}
	}
	return 0
}

func (n *fakeNode) Confirm(_ context.Context, key string, mode strategy.ConfirmMode) (bool, error) {
	if err := n.check(); err != nil {
		return false, err
	}
	if mode == strategy.ConfirmBeforeExpiry {
		if r, _ := n.Lookup(context.Background(), key); r.ExpiresAt.Before(time.Now()) {
			return false, nil
		}
	}
	return n.move(key, strategy.StatusConfirmed, false) == 1, nil
}

func (n *fakeNode) Release(_ context.Context, key string) (int, error) {
	if err := n.check(); err != nil {
		return 0, err
	}
	return n.move(key, strategy.StatusReleased, false), nil
}

func (n *fakeNode) ExpireDue(context.Context) (int, error) {
	if err := n.check(); err != nil {
		return 0, err
	}
	s := n.d.store
	s.mu.Lock()
	var due []string
	for _, r := range s.rows {
		for _, sku := range n.d.skus {
			if r.SKU == sku && r.Status == strategy.StatusHeld && r.ExpiresAt.Before(time.Now()) {
				due = append(due, r.Key)
			}
		}
	}
	s.mu.Unlock()
	units := 0
	for _, k := range due {
		units += n.move(k, strategy.StatusExpired, true)
	}
	return units, nil
}

var (
	_ strategy.Strategy  = (*fakeNode)(nil)
	_ strategy.Confirmer = (*fakeNode)(nil)
	_ strategy.Releaser  = (*fakeNode)(nil)
	_ strategy.Expirer   = (*fakeNode)(nil)
	_ strategy.Ager      = (*fakeDeployment)(nil)
	_ strategy.Restarter = (*fakeDeployment)(nil)
)

// fakeSkips are the scenarios that say nothing about the fakes: they keep
// their state in memory, per pool, so crashing or failing over the database
// server changes nothing for them, a deployment attached through another
// pool (partition, the failovers) finds no stock, and neither does one in a
// helper process (kill-*, process-*: the fakes are not registered, which
// would fail those scenarios with a setup error, TestUnfindableIsAnError).
var fakeSkips = []string{"server-crash", "commit-timeout", "failover-async", "failover-sync", "partition",
	"kill-release", "kill-reserve", "process-restart", "process-release"}

// TestKitPassesCorrectFake: the fake passes every scenario that can say
// something about it.
func TestKitPassesCorrectFake(t *testing.T) {
	strategytest.RunWith(t, fakeMeta("fake", false), pgtest.Pools, strategytest.Options{Skip: fakeSkips})
}

// TestKitFailsBrokenFake: the broken fake must be caught, with the right
// claims, by the same scenarios.
func TestKitFailsBrokenFake(t *testing.T) {
	db, admin := pgtest.Pools(t)
	results, err := strategytest.Verify(context.Background(), fakeMeta("fake-broken", true), db, admin,
		strategytest.Options{Short: true, Only: []string{"duplicate-key", "user-limit", "contention"}})
	require.NoError(t, err)
	violated := map[string][]string{}
	for _, r := range results {
		for _, c := range r.Violations() {
			violated[r.Scenario] = append(violated[r.Scenario], c.Claims)
		}
	}
	require.Contains(t, violated["duplicate-key"], strategy.IdempotentKey.String(), "duplicate keys must be caught: %v", violated)
	require.Contains(t, violated["user-limit"], strategy.OneActivePerUser.String(), "a user over the limit must be caught: %v", violated)
	require.Empty(t, violated["contention"], "distinct users and keys do not exercise the breakage")
}

// TestKitRunFailsTheTest runs Run on the broken fake in a helper process and
// checks that the test fails and names the strategy, scenario and claim.
func TestKitRunFailsTheTest(t *testing.T) {
	if os.Getenv("KIT_HELPER") == "1" {
		strategytest.RunWith(t, fakeMeta("fake-broken", true), pgtest.Pools, strategytest.Options{Skip: fakeSkips})
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKitRunFailsTheTest$", "-test.short")
	cmd.Env = append(os.Environ(), "KIT_HELPER=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the kit must fail a broken strategy; output:\n%s", out)
	for _, want := range []string{"VIOLATION: strategy fake-broken, scenario duplicate-key", "idempotent-key", "history:"} {
		require.True(t, strings.Contains(string(out), want), "output lacks %q:\n%s", want, out)
	}
}

func TestScenarioInputsAreValid(t *testing.T) {
	ins, err := strategytest.Scenarios()
	require.NoError(t, err)
	require.NotEmpty(t, ins)
}

// TestUnfindableIsAnError: a scenario that runs the strategy in helper
// processes fails with ErrSetup, naming the fix, for a strategy they
// cannot find by name; it is not n/a, where a conformance run would pass
// without it.
func TestUnfindableIsAnError(t *testing.T) {
	db, admin := pgtest.Pools(t)
	_, err := strategytest.Verify(context.Background(), fakeMeta("fake-unregistered", false), db, admin,
		strategytest.Options{Short: true, Only: []string{"process-restart"}})
	require.ErrorIs(t, err, strategytest.ErrSetup)
	require.ErrorContains(t, err, "RegisterForHelpers")
}
