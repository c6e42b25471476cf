// Package scenario runs the scenarios of table 28-1 against any registered
// strategy. The inputs are the JSON files in testdata/scenarios (embedded in
// package reservebench); the runners here turn them into real transactions,
// record every operation in a history, check the history against the durable
// state and judge each check against the strategy's claims.
//
// The conformance kit (strategy/strategytest) and the harness (compare) both
// run these definitions, so a strategy's own tests and table 28-1 can never
// disagree about what a scenario is.
package strategytest

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/strategy"
)

// The kinds of scenario, each with its runner.
const (
	KindRequests        = "requests"           // phases of concurrent reserve requests, restarts between them
	KindExpiryReplay    = "expiry-replay"      // C28-07
	KindConfirmVsExpire = "confirm-vs-expire"  // C28-08
	KindReleaseReplay   = "release-replay"     // C28-07, for Release
	KindReleaseConfirm  = "release-vs-confirm" // C28-08, for Release: a cancel races the payment
	KindInterleave      = "interleave"         // attempts held open, every ordering of their steps
	KindBadInput        = "bad-input"          // malformed requests
	KindKillRelease     = "kill-release"       // C28-09: a release process killed before commit
	KindKillReserve     = "kill-reserve"       // a process holding uncommitted reservations killed
	KindServerCrash     = "server-crash"       // pg_ctl stop -m immediate under load, then restart
	KindCommitTimeout   = "commit-timeout"     // the client gives up while COMMIT is in flight
	KindNodeDeath       = "node-death"         // requests die between a node's memory and the database
	KindExpiryRace      = "expiry-race"        // waves of concurrent expiry jobs over rows due at once

	// The service (package service) in front of the strategy, over real
	// HTTP connections on a loopback socket.
	KindHTTPAdmission  = "http-admission"  // C28-05: admission at the HTTP entry, clients retrying 503s
	KindHTTPDisconnect = "http-disconnect" // C28-06: a client that leaves after sending
	KindHTTPOverload   = "http-overload"   // seed 004: a full gate refuses at once; a queued client that leaves is dropped
	KindHTTPBadInput   = "http-bad-input"  // malformed HTTP requests: refused before admission, nothing written
	KindLockFault      = "lock-fault"      // seed 002: a lock that stops protecting its holder's open work
	KindRedisRestart   = "redis-restart"   // Redis SIGKILLed, stopped, restarted empty between batches of requests
)

// Scenario is one scenario file.
type Scenario struct {
	Name  string `json:"name"`
	Case  string `json:"case"` // the seed's case id, e.g. "C28-13", or "new"
	Title string `json:"title"`
	Kind  string `json:"kind"`
	Nodes int    `json:"nodes"`

	Stock []StockInput `json:"stock"`

	// Race marks scenarios whose failures are intermittent: the conformance
	// kit repeats them at least strategytest.RaceRepetitions times.
	Race             bool    `json:"race,omitempty"`
	Repetitions      int     `json:"repetitions"`
	ShortRepetitions int     `json:"short_repetitions"`
	ShortScale       float64 `json:"short_scale,omitempty"` // -short multiplies request counts by this

	// InternalDeadlineMS, when positive, is the trials' deployments'
	// strategy.Config.InternalDeadline in milliseconds: a scenario that
	// stalls the database for longer makes the strategy's own deadlines
	// fire (commit-timeout).
	InternalDeadlineMS int `json:"internal_deadline_ms,omitempty"`

	// KindRequests.
	Phases []Phase `json:"phases,omitempty"`

	// Gate starts the scenario's concurrent calls together behind a lock
	// on the strategy's tables, released once they all wait on it (see
	// gate.go): races that need two calls inside one short window are then
	// run inside it, rather than by luck.
	Gate bool `json:"gate,omitempty"`

	// KindExpiryReplay, KindConfirmVsExpire, KindReleaseReplay,
	// KindExpiryRace.
	Held     int `json:"held,omitempty"`      // reservations made first
	FirstDue int `json:"first_due,omitempty"` // how many of them expire in the first round
	// ThenDue (expiry-replay) is how many of the rest expire in the second
	// round, run by Workers concurrent jobs; nil means all of the rest.
	ThenDue *int `json:"then_due,omitempty"`
	Workers int  `json:"workers,omitempty"` // concurrent replays / confirmers / releasers
	// ThenRequests (expiry-replay, kill-release) new requests, from new
	// users, sent at once after the units came back: they may take exactly
	// the units that came back (seed C28-09, C28-10).
	ThenRequests int `json:"then_requests,omitempty"`
	// Release (release-replay) is how many of the held reservations are
	// released; the others stay HELD, so a unit returned twice shows in the
	// stock instead of hitting a CHECK on available <= total.
	Release int `json:"release,omitempty"`
	// Confirmed (confirm-vs-expire) due reservations are confirmed before
	// the expiry job runs alone: it must leave them CONFIRMED.
	Confirmed int `json:"confirmed,omitempty"`
	// Waves and WaveDue (expiry-race): WaveDue rows become due at once,
	// Workers jobs run concurrently, Waves times.
	Waves   int `json:"waves,omitempty"`
	WaveDue int `json:"wave_due,omitempty"`

	// Fault kinds. KillPoints (kill-release, kill-reserve) and CrashAfter
	// (server-crash: acknowledged reservations before the crash) are cycled
	// through by trial number.
	KillPoints []string `json:"kill_points,omitempty"`
	CrashAfter []int    `json:"crash_after,omitempty"`
	Requests   int      `json:"requests,omitempty"` // server-crash, commit-timeout: requests sent; node-death: sent after the restart
	Crashes    int      `json:"crashes,omitempty"`  // node-death: requests that die mid-reserve
	// ExclusiveServer marks scenarios that crash or reconfigure the server:
	// they run only where the harness has a server of their own (Env.Server).
	ExclusiveServer bool `json:"exclusive_server,omitempty"`
	// Paced marks scenarios whose time is mostly the seed's own timers (a
	// handler's work_ms, a read timeout), not work: a harness running many
	// cells at once (compare) gives them slots of their own, so their waits
	// never keep a busy cell from a core. It changes nothing in a trial.
	Paced bool `json:"paced,omitempty"`
	// Work, when set, is the cell's work in the units a harness running
	// many cells at once (compare) weighs the others in, the requests they
	// send: for a scenario whose requests do not show what it costs, one
	// made of checks (deployment-contract, every strategy's longest cell)
	// or of waits for a restarted Redis. Such a harness starts the heaviest
	// cells first, and compare runs a cell with Work beside the rest of its
	// strategy's cells, on a database and resources of its own, with slots
	// of its own: it is long because it waits. It changes nothing in a
	// trial.
	Work int `json:"work,omitempty"`

	// The http-* kinds: the front's admission limits (in_flight, queue,
	// wait_ms), the extra work per admitted request before the strategy
	// (work_ms), a refused client's back-off step (backoff_ms, C28-05),
	// the requests sent once the gate is full (extra, seed 004) and the
	// server's read timeout (read_timeout_ms, bad input). Requests is
	// the number of clients (C28-05).
	InFlight      int `json:"in_flight,omitempty"`
	Queue         int `json:"queue,omitempty"`
	WaitMs        int `json:"wait_ms,omitempty"`
	WorkMs        int `json:"work_ms,omitempty"`
	BackoffMs     int `json:"backoff_ms,omitempty"`
	Extra         int `json:"extra,omitempty"`
	ReadTimeoutMs int `json:"read_timeout_ms,omitempty"`
	// KillInFlight (redis-restart) adds the mid-run fault: Redis SIGKILLed
	// with requests in flight, on a SKU of its own.
	KillInFlight bool `json:"kill_in_flight,omitempty"`

	// KindLockFault: what makes the lock stop protecting its holder
	// (LockUnlockBeforeCommit, LockExpire, LockRestartEmpty).
	LockFault string `json:"lock_fault,omitempty"`

	// KindInterleave.
	Sessions  []SessionInput `json:"sessions,omitempty"`
	SeedOrder []string       `json:"seed_order,omitempty"` // the ordering the seed ran, shown in the table

	// Summary places the scenario's facts in the summary of table 28-1:
	// "counts" (the seed's counts column) or "boundary" (the observed
	// boundary column). Empty: only in the per-scenario sections.
	Summary string `json:"summary,omitempty"`

	// FaultInput holds the fields of the kinds of kinds.go.
	FaultInput

	// Seed is what the seed reported, by strategy name ("any" for all), shown
	// next to the measured counts so the seed's rows stay recognisable. It is
	// never used as an expectation.
	Seed map[string]string `json:"seed,omitempty"`
	// SeedInput holds the seed's own numbers for the input (names as
	// Numbers returns them). When this input's numbers differ, the table
	// says so next to what the seed reported.
	SeedInput map[string]int `json:"seed_input,omitempty"`
}

// StockInput is the stock of one SKU. Shares, when given, splits it over
// the nodes explicitly (one entry per node, summing to Total).
type StockInput struct {
	SKU    string `json:"sku"`
	Total  int    `json:"total"`
	Shares []int  `json:"shares,omitempty"`
}

// Phase is one step of a KindRequests scenario: either a set of request
// groups sent concurrently, or a restart of nodes.
type Phase struct {
	Name     string         `json:"name"`
	Requests []RequestGroup `json:"requests,omitempty"`
	Restart  []int          `json:"restart,omitempty"`
	// Confirm, in a restart phase, first confirms that many of the
	// reservations each restarted node held in the phases before: a
	// confirmed reservation still holds its unit, so a node that rebuilds
	// its stock from the HELD rows alone sells it again.
	Confirm int `json:"confirm,omitempty"`
	// InFlight, in a restart phase, sends one request to each listed node
	// (a new key and user, the first SKU) and holds it in flight, queued on
	// a lock the harness takes on the strategy's tables, while the restart
	// runs (inflight.go): a node that recounts from the committed rows and
	// does not wait for its own requests sells their units again.
	InFlight []int `json:"in_flight,omitempty"`
	// Repeat runs the phase that many times in a row, each round with keys
	// and users of its own (suffixed -r0, -r1, ...): many small races, each
	// started on its own, instead of one large one. 0 means 1.
	Repeat int `json:"repeat,omitempty"`
	// HoldGateMs sends the phase's requests behind the gate (gate.go), also
	// in a scenario without it, and keeps the gate closed this many
	// milliseconds after they have all queued: a transaction that holds the
	// strategy's tables for a while. A strategy must wait it out or answer
	// BUSY; SOLD_OUT while units remain is a phantom sold-out.
	HoldGateMs int `json:"hold_gate_ms,omitempty"`
	// FirstTrialOnly runs the phase in the scenario's first repetition
	// only: a deterministic fault (a held gate) needs no repeating.
	FirstTrialOnly bool `json:"first_trial_only,omitempty"`
	// SumSKUs reports the phase's outcomes summed over its SKUs, on one
	// line: where one key races for two SKUs, which SKU wins is chance,
	// and the table holds only what every run repeats.
	SumSKUs bool `json:"sum_skus,omitempty"`
}

// RequestGroup is Count requests for one SKU. Without Key every request has
// its own key; without User every request has its own user. Without Node the
// requests go round-robin over the nodes.
type RequestGroup struct {
	SKU   string `json:"sku"`
	Count int    `json:"count"`
	Key   string `json:"key,omitempty"`
	User  string `json:"user,omitempty"`
	Node  *int   `json:"node,omitempty"`
	// Groups repeats the group that many times at once, each copy with its
	// own key and user (suffixed -g0, -g1, ...): many independent races in
	// one phase. 0 means 1.
	Groups int `json:"groups,omitempty"`
}

// SessionInput is one attempt of an interleaving. A session that holds
// ("hold": true) has two steps, "<name>.reserve" and "<name>.end" (commit or
// rollback); one that does not is a single step "<name>": reserve and commit.
type SessionInput struct {
	Name string `json:"name"`
	User string `json:"user"`
	Key  string `json:"key"`
	SKU  string `json:"sku,omitempty"` // default: the first SKU of the stock
	Hold bool   `json:"hold,omitempty"`
	End  string `json:"end,omitempty"` // "commit" (default) or "rollback"
}

// ErrInput is matched by every error about a malformed scenario file.
var ErrInput = errors.New("invalid scenario input")

// scenarioFiles holds the scenario inputs, one JSON file per scenario: the
// single definition of what every strategy is run against.
//
//go:embed scenarios/*.json
var scenarioFiles embed.FS

// Scenarios reads and validates every scenario in scenarios/, sorted by name.
func Scenarios() ([]*Scenario, error) { return LoadScenarios(scenarioFiles, "scenarios") }

// LoadScenarios reads and validates every *.json file in dir of fsys.
func LoadScenarios(fsys fs.FS, dir string) ([]*Scenario, error) {
	names, err := fs.Glob(fsys, path.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []*Scenario
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		in, err := ParseScenario(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if want := strings.TrimSuffix(path.Base(name), ".json"); in.Name != want {
			return nil, fmt.Errorf("%s: %w: name %q does not match the file name", name, ErrInput, in.Name)
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// MustScenario returns the scenario with this name, or panics: for tests.
func MustScenario(name string) *Scenario {
	all, err := Scenarios()
	if err != nil {
		panic(err)
	}
	for _, in := range all {
		if in.Name == name {
			return in
		}
	}
	panic("scenario: no scenario named " + name)
}

// ParseScenario decodes one scenario, rejecting unknown fields, and validates it.
// A field the kind needs is required, not defaulted: a scenario without
// "total" must not run as 0 units and pass every check vacuously.
func ParseScenario(b []byte) (*Scenario, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var in Scenario
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInput, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: %s: more than one JSON value", ErrInput, in.Name)
	}
	if err := requireFields(b, &in); err != nil {
		return nil, err
	}
	if err := in.Validate(); err != nil {
		return nil, err
	}
	return &in, nil
}

// requiredByKind lists the fields each kind needs besides those every
// scenario needs.
var requiredByKind = map[string][]string{
	KindRequests:        {"phases"},
	KindExpiryReplay:    {"held", "first_due", "workers"},
	KindConfirmVsExpire: {"held", "workers", "confirmed"},
	KindReleaseReplay:   {"held", "workers", "release"},
	KindReleaseConfirm:  {"held"},
	KindInterleave:      {"sessions"},
	KindBadInput:        {},
	KindKillRelease:     {"held", "first_due", "kill_points"},
	KindKillReserve:     {"held", "kill_points"},
	KindNodeDeath:       {"held", "crashes", "requests"},
	KindServerCrash:     {"requests", "workers", "crash_after", "exclusive_server"},
	KindCommitTimeout:   {"requests", "workers", "exclusive_server"},
	KindExpiryRace:      {"held", "waves", "wave_due", "workers"},
	KindHTTPAdmission:   {"requests", "in_flight", "queue", "wait_ms", "work_ms", "backoff_ms"},
	KindHTTPDisconnect:  {"in_flight", "queue", "wait_ms", "work_ms"},
	KindHTTPOverload:    {"in_flight", "queue", "wait_ms", "extra"},
	KindHTTPBadInput:    {"in_flight", "queue", "wait_ms", "read_timeout_ms"},
	KindLockFault:       {"lock_fault"},
	KindRedisRestart:    {"requests", "then_requests"},
}

// requireFields checks that every field the scenario's kind needs is
// present in the file, whatever its value.
func requireFields(b []byte, in *Scenario) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return fmt.Errorf("%w: %v", ErrInput, err)
	}
	var missing []string
	need := append([]string{"name", "case", "title", "kind", "nodes", "stock", "repetitions", "short_repetitions"}, requiredByKind[in.Kind]...)
	for _, f := range need {
		if _, ok := top[f]; !ok {
			missing = append(missing, f)
		}
	}
	var stock []map[string]json.RawMessage
	if raw, ok := top["stock"]; ok {
		if err := json.Unmarshal(raw, &stock); err != nil {
			return fmt.Errorf("%w: %s: stock: %v", ErrInput, in.Name, err)
		}
	}
	for i, st := range stock {
		for _, f := range []string{"sku", "total"} {
			if _, ok := st[f]; !ok {
				missing = append(missing, fmt.Sprintf("stock[%d].%s", i, f))
			}
		}
	}
	var phases []struct {
		Requests []map[string]json.RawMessage `json:"requests"`
	}
	if raw, ok := top["phases"]; ok {
		if err := json.Unmarshal(raw, &phases); err != nil {
			return fmt.Errorf("%w: %s: phases: %v", ErrInput, in.Name, err)
		}
	}
	for pi, ph := range phases {
		for gi, g := range ph.Requests {
			for _, f := range []string{"sku", "count"} {
				if _, ok := g[f]; !ok {
					missing = append(missing, fmt.Sprintf("phases[%d].requests[%d].%s", pi, gi, f))
				}
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s: missing required field(s): %s", ErrInput, in.Name, strings.Join(missing, ", "))
	}
	return nil
}

// Validate checks that the input can be run.
func (in *Scenario) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInput, in.Name, fmt.Sprintf(format, args...))
	}
	if in.Name == "" {
		return bad("missing name")
	}
	if in.Nodes < 1 {
		return bad("nodes must be at least 1")
	}
	if in.Repetitions < 1 || in.ShortRepetitions < 1 {
		return bad("repetitions and short_repetitions must be at least 1")
	}
	if in.ShortScale < 0 || in.ShortScale > 1 {
		return bad("short_scale must be in [0, 1]")
	}
	if in.InternalDeadlineMS < 0 {
		return bad("internal_deadline_ms must not be negative")
	}
	if len(in.Stock) == 0 {
		return bad("no stock")
	}
	skus := map[string]bool{}
	for _, s := range in.Stock {
		if s.SKU == "" || s.Total < 0 || skus[s.SKU] {
			return bad("stock entry %+v: empty, negative or repeated", s)
		}
		skus[s.SKU] = true
		if s.Shares != nil {
			if len(s.Shares) != in.Nodes {
				return bad("stock %s: %d shares for %d nodes", s.SKU, len(s.Shares), in.Nodes)
			}
			sum := 0
			for _, n := range s.Shares {
				if n < 0 {
					return bad("stock %s: negative share in %v", s.SKU, s.Shares)
				}
				sum += n
			}
			if sum != s.Total {
				return bad("stock %s: shares %v sum to %d, not the total %d", s.SKU, s.Shares, sum, s.Total)
			}
		}
	}
	if in.ThenRequests < 0 {
		return bad("then_requests must not be negative")
	}
	switch in.Kind {
	case KindRequests:
		if len(in.Phases) == 0 {
			return bad("no phases")
		}
		for _, p := range in.Phases {
			if (len(p.Requests) == 0) == (len(p.Restart) == 0) {
				return bad("phase %q must have either requests or restart", p.Name)
			}
			for _, g := range p.Requests {
				if !skus[g.SKU] {
					return bad("phase %q: unknown sku %q", p.Name, g.SKU)
				}
				if g.Count < 1 {
					return bad("phase %q: count must be at least 1", p.Name)
				}
				if g.Groups < 0 {
					return bad("phase %q: groups must not be negative", p.Name)
				}
				if p.Repeat < 0 {
					return bad("phase %q: repeat must not be negative", p.Name)
				}
				if g.Node != nil && (*g.Node < 0 || *g.Node >= in.Nodes) {
					return bad("phase %q: node %d out of range", p.Name, *g.Node)
				}
			}
			for _, n := range p.Restart {
				if n < 0 || n >= in.Nodes {
					return bad("phase %q: restart node %d out of range", p.Name, n)
				}
			}
			for _, n := range p.InFlight {
				if n < 0 || n >= in.Nodes {
					return bad("phase %q: in_flight node %d out of range", p.Name, n)
				}
			}
			if len(p.InFlight) > 0 && len(p.Restart) == 0 {
				return bad("phase %q: in_flight comes with restart", p.Name)
			}
			if p.Confirm < 0 || p.Confirm > 0 && len(p.Restart) == 0 {
				return bad("phase %q: confirm must be positive and comes with restart", p.Name)
			}
		}
	case KindExpiryReplay:
		if in.Held < 1 || in.FirstDue < 0 || in.FirstDue > in.Held || in.Workers < 1 {
			return bad("need held >= 1, 0 <= first_due <= held, workers >= 1")
		}
		if in.ThenDue != nil && (*in.ThenDue < 0 || *in.ThenDue > in.Held-in.FirstDue) {
			return bad("need 0 <= then_due <= held - first_due")
		}
	case KindConfirmVsExpire:
		if in.Held < 1 || in.Workers < 1 || in.Confirmed < 0 || 2*in.Confirmed >= in.Held {
			return bad("need held >= 1, workers >= 1 and 0 <= 2 * confirmed < held")
		}
	case KindReleaseReplay:
		if in.Held < 1 || in.Workers < 1 || in.Release < 1 || in.Release > in.Held {
			return bad("need held >= 1, workers >= 1 and 1 <= release <= held")
		}
	case KindReleaseConfirm:
		if in.Held < 1 {
			return bad("need held >= 1")
		}
	case KindExpiryRace:
		if in.Held < 1 || in.Workers < 2 || in.Waves < 1 || in.WaveDue < 1 || in.Waves*in.WaveDue > in.Held {
			return bad("need held >= 1, workers >= 2, waves >= 1, wave_due >= 1 and waves * wave_due <= held")
		}
	case KindInterleave:
		if len(in.Sessions) < 2 {
			return bad("an interleaving needs at least two sessions")
		}
		names := map[string]bool{}
		for _, s := range in.Sessions {
			if s.Name == "" || names[s.Name] || strings.Contains(s.Name, ".") {
				return bad("session name %q empty, repeated or dotted", s.Name)
			}
			names[s.Name] = true
			if s.SKU != "" && !skus[s.SKU] {
				return bad("session %s: unknown sku %q", s.Name, s.SKU)
			}
			if s.End != "" && s.End != "commit" && s.End != "rollback" {
				return bad("session %s: end must be commit or rollback", s.Name)
			}
			if s.User == "" || s.Key == "" {
				return bad("session %s: needs user and key", s.Name)
			}
		}
		if len(in.SeedOrder) > 0 {
			steps := map[string]bool{}
			for _, st := range in.steps() {
				steps[st.Name] = true
			}
			if len(in.SeedOrder) != len(steps) {
				return bad("seed_order must list every step once")
			}
			for _, name := range in.SeedOrder {
				if !steps[name] {
					return bad("seed_order: unknown step %q", name)
				}
				delete(steps, name)
			}
		}
	case KindBadInput:
	case KindKillRelease, KindKillReserve:
		if in.Held < 1 || len(in.KillPoints) == 0 {
			return bad("need held >= 1 and kill_points")
		}
		for _, k := range in.KillPoints {
			if k != KillBefore && k != KillUncommitted {
				return bad("kill point %q: want %q or %q", k, KillBefore, KillUncommitted)
			}
		}
		if in.Kind == KindKillRelease && (in.FirstDue < 1 || in.FirstDue > in.Held) {
			return bad("need 1 <= first_due <= held")
		}
	case KindNodeDeath:
		if in.Held < 0 || in.Crashes < 1 || in.Requests < 1 {
			return bad("need held >= 0, crashes >= 1 and requests >= 1")
		}
	case KindLockFault:
		switch in.LockFault {
		case LockUnlockBeforeCommit, LockExpire, LockRestartEmpty:
		default:
			return bad("lock_fault %q: want %q, %q or %q", in.LockFault, LockUnlockBeforeCommit, LockExpire, LockRestartEmpty)
		}
		if in.Nodes != 1 || len(in.Stock) != 1 {
			return bad("a lock fault runs on one node and one SKU")
		}
	case KindRedisRestart:
		if in.Requests < 1 || in.ThenRequests < 1 {
			return bad("need requests >= 1 and then_requests >= 1")
		}
	case KindServerCrash, KindCommitTimeout:
		if in.Requests < 1 || in.Workers < 1 || !in.ExclusiveServer {
			return bad("need requests >= 1, workers >= 1 and exclusive_server")
		}
		if in.Kind == KindServerCrash && len(in.CrashAfter) == 0 {
			return bad("need crash_after")
		}
		if in.Kind == KindCommitTimeout && len(in.Stock) < 4 {
			return bad("need four SKUs or more: the requests go to all but the last three, which are the ended wave's, the session's and the release's")
		}
	case KindHTTPAdmission, KindHTTPDisconnect, KindHTTPOverload, KindHTTPBadInput:
		if in.InFlight < 1 || in.Queue < 0 || in.WaitMs < 1 || in.WorkMs < 0 || in.BackoffMs < 0 || in.Extra < 0 || in.ReadTimeoutMs < 0 {
			return bad("need in_flight >= 1, queue >= 0, wait_ms >= 1 and no negative work_ms, backoff_ms, extra, read_timeout_ms")
		}
		switch {
		case in.Kind == KindHTTPAdmission && (in.Requests < 1 || in.BackoffMs < 1):
			return bad("need requests >= 1 and backoff_ms >= 1")
		case in.Kind == KindHTTPOverload && (in.Extra < 1 || in.Stock[0].Total < 2*in.InFlight+in.Queue+2):
			return bad("need extra >= 1 and a stock of at least 2 * in_flight + queue + 2 (every admitted request is sold a unit)")
		case in.Kind == KindHTTPBadInput && in.ReadTimeoutMs < 1:
			return bad("need read_timeout_ms >= 1")
		}
	default:
		if err := in.validateExtra(); err != nil {
			return err
		}
	}
	switch in.Summary {
	case "", "counts", "boundary":
	default:
		return bad("summary must be counts or boundary")
	}
	return nil
}

// SeedFor returns what the seed reported for a strategy, or "". When this
// input's numbers differ from the seed's own (SeedInput), it says so: the
// seed's counts then describe another input.
func (in *Scenario) SeedFor(name string) string {
	s, ok := in.Seed[name]
	if !ok {
		s = in.Seed["any"]
	}
	if s == "" {
		return ""
	}
	if d := in.SeedInputDiffers(); d != "" {
		s += " (on the seed's input; this one differs: " + d + ")"
	}
	return s
}

// Numbers are the scenario's sizes that its counts depend on, by name:
// total (all SKUs), nodes, requests (the first phase of requests), and the
// kind's own counts that are set.
func (in *Scenario) Numbers() map[string]int {
	out := map[string]int{"nodes": in.Nodes}
	for _, s := range in.Stock {
		out["total"] += s.Total
	}
	for _, p := range in.Phases {
		if len(p.Requests) == 0 {
			continue
		}
		for _, g := range p.Requests {
			out["requests"] += g.Count * max(g.Groups, 1) * max(p.Repeat, 1)
		}
		break
	}
	for name, v := range map[string]int{"held": in.Held, "first_due": in.FirstDue, "workers": in.Workers,
		"then_requests": in.ThenRequests, "release": in.Release, "confirmed": in.Confirmed, "waves": in.Waves,
		"wave_due": in.WaveDue, "crashes": in.Crashes, "in_flight": in.InFlight, "queue": in.Queue, "wait_ms": in.WaitMs,
		"work_ms": in.WorkMs, "backoff_ms": in.BackoffMs, "extra": in.Extra} {
		if v != 0 {
			out[name] = v
		}
	}
	if in.Requests != 0 {
		out["requests"] = in.Requests
	}
	return out
}

// SeedInputDiffers names the numbers in which this input differs from the
// seed's own input, e.g. "requests 120, the seed's 150", or "".
func (in *Scenario) SeedInputDiffers() string {
	have := in.Numbers()
	var diffs []string
	for _, name := range sortedKeys(in.SeedInput) {
		if want := in.SeedInput[name]; have[name] != want {
			diffs = append(diffs, fmt.Sprintf("%s %d, the seed's %d", name, have[name], want))
		}
	}
	return strings.Join(diffs, "; ")
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// limits are the admission limits of an http-* scenario. Retry-After is
// the seed's 1 second whatever the wait.
func (in *Scenario) limits() admission.Limits {
	return admission.Limits{InFlight: in.InFlight, Queue: in.Queue, Wait: millis(in.WaitMs), RetryAfter: time.Second}
}

func (in *Scenario) stock(suffix string) []strategy.Stock {
	out := make([]strategy.Stock, len(in.Stock))
	for i, s := range in.Stock {
		out[i] = strategy.Stock{SKU: s.SKU + suffix, Total: s.Total, Shares: s.Shares}
	}
	return out
}
