package controls_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/reservebench/reservebench/compare/internal/controls"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/resourcetest"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

// TestOne runs one negative control in one scenario and logs its facts
// and every failed check with the start of its history: the loop for
// building a control or a check. RESERVEBENCH_CONTROL names the control,
// RESERVEBENCH_SCENARIO the scenario; without them it skips:
//
//	RESERVEBENCH_CONTROL=ctl-lost-update RESERVEBENCH_SCENARIO=contention \
//	  go test -count=1 -run TestOne -v ./compare/internal/controls
func TestOne(t *testing.T) {
	name, sc := os.Getenv("RESERVEBENCH_CONTROL"), os.Getenv("RESERVEBENCH_SCENARIO")
	if name == "" || sc == "" {
		t.Skip("set RESERVEBENCH_CONTROL and RESERVEBENCH_SCENARIO to run one control in one scenario")
	}
	found := false
	for _, c := range controls.All() {
		if c.Meta.Name != name {
			continue
		}
		found = true
		in := strategytest.MustScenario(sc)
		env := strategytest.Env{Meta: c.Meta, Resources: resourcetest.New(t, c.Meta), Logf: t.Logf}
		if in.ExclusiveServer {
			own := ownServer(t)
			env.DB, env.Admin = ownDatabase(t, own)
			env.Server = own
		} else {
			env.DB, env.Admin = pgtest.Pools(t)
		}
		r, err := strategytest.RunScenario(context.Background(), env, in)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range r.Facts {
			t.Logf("fact %s: %s", f.Name, f.Value)
		}
		for _, f := range r.Varying {
			t.Logf("vary %s: %s", f.Name, f.Value)
		}
		for _, ch := range r.Checks {
			if ch.Failed > 0 {
				t.Logf("check %s [%s] %s %s failed %d/%d: %s\n%s", ch.Verdict, ch.Claims, ch.Name, ch.What, ch.Failed, ch.Trials, ch.Detail, strings.Join(strings.Split(ch.History, "\n")[:min(10, len(strings.Split(ch.History, "\n")))], "\n"))
			}
		}
	}
	if !found {
		t.Fatalf("no negative control named %q", name)
	}
}
