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

	"github.com/reservebench/reservebench/strategy"
)

// The kinds of scenario, each with its runner.
const (
	KindRequests        = "requests"          // phases of concurrent reserve requests, restarts between them
	KindExpiryReplay    = "expiry-replay"     // C28-07
	KindConfirmVsExpire = "confirm-vs-expire" // C28-08
	KindReleaseReplay   = "release-replay"    // C28-07, for Release
	KindInterleave      = "interleave"        // attempts held open, every ordering of their steps
	KindBadInput        = "bad-input"         // malformed requests
	KindKillRelease     = "kill-release"      // C28-09: a release process killed before commit
	KindKillReserve     = "kill-reserve"      // a process holding uncommitted reservations killed
	KindServerCrash     = "server-crash"      // pg_ctl stop -m immediate under load, then restart
	KindCommitTimeout   = "commit-timeout"    // the client gives up while COMMIT is in flight
	KindNodeDeath       = "node-death"        // requests die between a node's memory and the database
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

	// KindRequests.
	Phases []Phase `json:"phases,omitempty"`

	// KindExpiryReplay, KindConfirmVsExpire, KindReleaseReplay.
	Held     int `json:"held,omitempty"`      // reservations made first
	FirstDue int `json:"first_due,omitempty"` // how many of them expire in the first round
	Workers  int `json:"workers,omitempty"`   // concurrent replays / confirmers / releasers

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

	// KindInterleave.
	Sessions  []SessionInput `json:"sessions,omitempty"`
	SeedOrder []string       `json:"seed_order,omitempty"` // the ordering the seed ran, shown in the table

	// Summary places the scenario's facts in the summary of table 28-1:
	// "counts" (the seed's counts column) or "boundary" (the observed
	// boundary column). Empty: only in the per-scenario sections.
	Summary string `json:"summary,omitempty"`

	// Seed is what the seed reported, by strategy name ("any" for all), shown
	// next to the measured counts so the seed's rows stay recognisable. It is
	// never used as an expectation.
	Seed map[string]string `json:"seed,omitempty"`
}

// StockInput is the stock of one SKU.
type StockInput struct {
	SKU   string `json:"sku"`
	Total int    `json:"total"`
}

// Phase is one step of a KindRequests scenario: either a set of request
// groups sent concurrently, or a restart of nodes.
type Phase struct {
	Name     string         `json:"name"`
	Requests []RequestGroup `json:"requests,omitempty"`
	Restart  []int          `json:"restart,omitempty"`
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
func ParseScenario(b []byte) (*Scenario, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var in Scenario
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInput, err)
	}
	if err := in.Validate(); err != nil {
		return nil, err
	}
	return &in, nil
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
	if len(in.Stock) == 0 {
		return bad("no stock")
	}
	skus := map[string]bool{}
	for _, s := range in.Stock {
		if s.SKU == "" || s.Total < 0 || skus[s.SKU] {
			return bad("stock entry %+v: empty, negative or repeated", s)
		}
		skus[s.SKU] = true
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
				if g.Node != nil && (*g.Node < 0 || *g.Node >= in.Nodes) {
					return bad("phase %q: node %d out of range", p.Name, *g.Node)
				}
			}
			for _, n := range p.Restart {
				if n < 0 || n >= in.Nodes {
					return bad("phase %q: restart node %d out of range", p.Name, n)
				}
			}
		}
	case KindExpiryReplay:
		if in.Held < 1 || in.FirstDue < 0 || in.FirstDue > in.Held || in.Workers < 1 {
			return bad("need held >= 1, 0 <= first_due <= held, workers >= 1")
		}
	case KindConfirmVsExpire, KindReleaseReplay:
		if in.Held < 1 || in.Workers < 1 {
			return bad("need held >= 1 and workers >= 1")
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
	case KindServerCrash, KindCommitTimeout:
		if in.Requests < 1 || in.Workers < 1 || !in.ExclusiveServer {
			return bad("need requests >= 1, workers >= 1 and exclusive_server")
		}
		if in.Kind == KindServerCrash && len(in.CrashAfter) == 0 {
			return bad("need crash_after")
		}
	default:
		return bad("unknown kind %q", in.Kind)
	}
	switch in.Summary {
	case "", "counts", "boundary":
	default:
		return bad("summary must be counts or boundary")
	}
	return nil
}

// SeedFor returns what the seed reported for a strategy, or "".
func (in *Scenario) SeedFor(name string) string {
	if s, ok := in.Seed[name]; ok {
		return s
	}
	return in.Seed["any"]
}

func (in *Scenario) stock(suffix string) []strategy.Stock {
	out := make([]strategy.Stock, len(in.Stock))
	for i, s := range in.Stock {
		out[i] = strategy.Stock{SKU: s.SKU + suffix, Total: s.Total}
	}
	return out
}
