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

func TestParseRejectsBadInput(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":          `{"name":"x","case":"c","kind":"bad-input","nodes":1,"stock":[{"sku":"a","total":1}],"repetitions":1,"short_repetitions":1,"colour":"red"}`,
		"unknown kind":           `{"name":"x","case":"c","kind":"dance","nodes":1,"stock":[{"sku":"a","total":1}],"repetitions":1,"short_repetitions":1}`,
		"no stock":               `{"name":"x","case":"c","kind":"bad-input","nodes":1,"repetitions":1,"short_repetitions":1}`,
		"zero nodes":             `{"name":"x","case":"c","kind":"bad-input","nodes":0,"stock":[{"sku":"a","total":1}],"repetitions":1,"short_repetitions":1}`,
		"bad kill point":         `{"name":"x","case":"c","kind":"kill-reserve","nodes":1,"stock":[{"sku":"a","total":1}],"held":1,"kill_points":["later"],"repetitions":1,"short_repetitions":1}`,
		"unknown sku":            `{"name":"x","case":"c","kind":"requests","nodes":1,"stock":[{"sku":"a","total":1}],"phases":[{"requests":[{"sku":"b","count":1}]}],"repetitions":1,"short_repetitions":1}`,
		"node out of range":      `{"name":"x","case":"c","kind":"requests","nodes":1,"stock":[{"sku":"a","total":1}],"phases":[{"requests":[{"sku":"a","count":1,"node":1}]}],"repetitions":1,"short_repetitions":1}`,
		"seed order wrong":       `{"name":"x","case":"c","kind":"interleave","nodes":1,"stock":[{"sku":"a","total":1}],"sessions":[{"name":"t1","user":"u","key":"k","hold":true},{"name":"t2","user":"v","key":"l"}],"seed_order":["t1.reserve","t2"],"repetitions":1,"short_repetitions":1}`,
		"crash without a server": `{"name":"x","case":"c","kind":"server-crash","nodes":1,"stock":[{"sku":"a","total":1}],"requests":1,"workers":1,"crash_after":[1],"repetitions":1,"short_repetitions":1}`,
	} {
		if _, err := ParseScenario([]byte(doc)); !errors.Is(err, ErrInput) {
			t.Errorf("%s: Parse gave %v, want an error matching ErrInput", name, err)
		}
	}
}
