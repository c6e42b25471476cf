package strategytest

import (
	"errors"
	"strings"
	"testing"
)

func TestLoadEveryScenario(t *testing.T) {
	all, err := Scenarios()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < 10 {
		t.Fatalf("loaded %d scenarios", len(all))
	}
	for _, in := range all {
		runnerFor(in) // panics on a kind without a runner
		if in.Title == "" || in.Case == "" {
			t.Errorf("%s: needs a title and a case", in.Name)
		}
	}
}

// TestOrderings: every ordering of the steps that keeps each held session's
// reserve before its end, as isolationtester runs them without a
// permutation list: 4 steps with one constraint give 4!/2 = 12.
func TestOrderings(t *testing.T) {
	for name, want := range map[string]int{"phantom": 12, "same-user": 6, "same-key": 6} {
		in := MustScenario(name)
		all := orderings(in.steps())
		if len(all) != want {
			t.Errorf("%s: %d orderings, want %d", name, len(all), want)
		}
		seen := map[string]bool{}
		for _, o := range all {
			key := orderName(o)
			if seen[key] {
				t.Errorf("%s: ordering %q twice", name, key)
			}
			seen[key] = true
			pos := map[string]int{}
			for i, s := range o {
				pos[s.Name] = i
			}
			for _, s := range in.Sessions {
				if s.Hold && pos[s.Name+".end"] < pos[s.Name+".reserve"] {
					t.Errorf("%s: ordering %q ends %s before it reserves", name, key, s.Name)
				}
			}
		}
		if in.SeedOrder != nil && !seen[strings.Join(in.SeedOrder, " ")] {
			t.Errorf("%s: the seed's ordering is not among the orderings run", name)
		}
	}
}

// TestParseRejectsBadInput: every input that would run as something else
// than written is refused with ErrInput, and the message says why. Each case
// changes one field of a valid scenario, so it fails for its own reason.
func TestParseRejectsBadInput(t *testing.T) {
	base := map[string]string{
		"bad-input":     `{"name":"x","case":"c","title":"t","kind":"bad-input","nodes":1,"stock":[{"sku":"a","total":1}],"repetitions":1,"short_repetitions":1}`,
		"requests":      `{"name":"x","case":"c","title":"t","kind":"requests","nodes":1,"stock":[{"sku":"a","total":1}],"phases":[{"requests":[{"sku":"a","count":1}]}],"repetitions":1,"short_repetitions":1}`,
		"expiry-replay": `{"name":"x","case":"c","title":"t","kind":"expiry-replay","nodes":1,"stock":[{"sku":"a","total":4}],"held":4,"first_due":2,"workers":2,"repetitions":1,"short_repetitions":1}`,
	}
	for kind, doc := range base {
		if _, err := ParseScenario([]byte(doc)); err != nil {
			t.Fatalf("the valid %s scenario is refused: %v", kind, err)
		}
	}
	for _, c := range []struct{ name, kind, from, to, want string }{
		{"unknown field", "bad-input", `"repetitions":1,`, `"repetitions":1,"colour":"red",`, "unknown field"},
		{"unknown kind", "bad-input", `"kind":"bad-input"`, `"kind":"dance"`, "unknown kind"},
		{"no stock", "bad-input", `"stock":[{"sku":"a","total":1}],`, ``, "stock"},
		{"missing total", "bad-input", `{"sku":"a","total":1}`, `{"sku":"a"}`, "stock[0].total"},
		{"missing title", "bad-input", `"title":"t",`, ``, "title"},
		{"missing first_due", "expiry-replay", `"first_due":2,`, ``, "first_due"},
		{"missing count", "requests", `{"sku":"a","count":1}`, `{"sku":"a"}`, "count"},
		{"zero nodes", "bad-input", `"nodes":1`, `"nodes":0`, "nodes"},
		{"unknown sku", "requests", `{"sku":"a","count":1}`, `{"sku":"b","count":1}`, "unknown sku"},
		{"node out of range", "requests", `{"sku":"a","count":1}`, `{"sku":"a","count":1,"node":1}`, "out of range"},
		{"shares of the wrong sum", "bad-input", `{"sku":"a","total":1}`, `{"sku":"a","total":1,"shares":[2]}`, "sum"},
		{"shares for other nodes", "bad-input", `{"sku":"a","total":1}`, `{"sku":"a","total":1,"shares":[1,0]}`, "shares for 1 nodes"},
		{"first_due over held", "expiry-replay", `"first_due":2`, `"first_due":5`, "first_due"},
		{"then_due over the rest", "expiry-replay", `"first_due":2,`, `"first_due":2,"then_due":3,`, "then_due"},
		{"a second JSON value", "bad-input", `"short_repetitions":1}`, `"short_repetitions":1} {}`, "more than one"},
	} {
		doc := strings.Replace(base[c.kind], c.from, c.to, 1)
		if doc == base[c.kind] {
			t.Fatalf("%s: the change did not apply", c.name)
		}
		_, err := ParseScenario([]byte(doc))
		if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Parse gave %v, want an error matching ErrInput that mentions %q", c.name, err, c.want)
		}
	}
	for name, doc := range map[string]string{
		"bad kill point":         `{"name":"x","case":"c","title":"t","kind":"kill-reserve","nodes":1,"stock":[{"sku":"a","total":1}],"held":1,"kill_points":["later"],"repetitions":1,"short_repetitions":1}`,
		"seed order wrong":       `{"name":"x","case":"c","title":"t","kind":"interleave","nodes":1,"stock":[{"sku":"a","total":1}],"sessions":[{"name":"t1","user":"u","key":"k","hold":true},{"name":"t2","user":"v","key":"l"}],"seed_order":["t1.reserve","t2"],"repetitions":1,"short_repetitions":1}`,
		"crash without a server": `{"name":"x","case":"c","title":"t","kind":"server-crash","nodes":1,"stock":[{"sku":"a","total":1}],"requests":1,"workers":1,"crash_after":[1],"repetitions":1,"short_repetitions":1}`,
	} {
		if _, err := ParseScenario([]byte(doc)); !errors.Is(err, ErrInput) {
			t.Errorf("%s: Parse gave %v, want an error matching ErrInput", name, err)
		}
	}
}

// TestSeedInputDiffers: the seed's report is shown with a note when this
// input's numbers are not the seed's.
func TestSeedInputDiffers(t *testing.T) {
	in := MustScenario("sell-out")
	if d := in.SeedInputDiffers(); d != "" {
		t.Fatalf("sell-out is the seed's own input, but differs: %s", d)
	}
	changed := *in
	changed.Stock = []StockInput{{SKU: "sku-lab-01", Total: 30}}
	if d := changed.SeedInputDiffers(); !strings.Contains(d, "total 30, the seed's 40") {
		t.Errorf("total changed to 30: %q", d)
	}
	if s := changed.SeedFor("hotrow"); !strings.Contains(s, "this one differs") {
		t.Errorf("SeedFor does not say the input differs: %q", s)
	}
}

// TestUnknownScenarioNamesRefused: a misspelt name in Options.Only would
// run nothing and pass; it is refused with the list of names instead.
func TestUnknownScenarioNamesRefused(t *testing.T) {
	ins, err := Scenarios()
	if err != nil {
		t.Fatal(err)
	}
	if err := (Options{Only: []string{"storm"}, Skip: []string{"contention"}}).checkNames(ins); err != nil {
		t.Fatalf("known names: %v", err)
	}
	for _, o := range []Options{{Only: []string{""}}, {Only: []string{"storm", "strom"}}, {Skip: []string{"Storm"}}} {
		if err := o.checkNames(ins); !errors.Is(err, ErrUnknownScenario) {
			t.Errorf("%+v: %v, want ErrUnknownScenario", o, err)
		}
	}
}
