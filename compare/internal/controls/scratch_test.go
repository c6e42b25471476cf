package controls_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/reservebench/reservebench/compare/internal/controls"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestScratch(t *testing.T) {
	name, sc := os.Getenv("CTL"), os.Getenv("SC")
	if name == "" {
		t.Skip()
	}
	for _, c := range controls.All() {
		if c.Meta.Name != name {
			continue
		}
		db, admin := pgtest.Pools(t)
		r, err := strategytest.RunScenario(context.Background(), strategytest.Env{Meta: c.Meta, DB: db, Admin: admin, Logf: t.Logf}, strategytest.MustScenario(sc))
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
				t.Logf("check %s [%s] %s failed %d/%d: %s\n%s", ch.Verdict, ch.Claims, ch.What, ch.Failed, ch.Trials, ch.Detail, strings.Join(strings.Split(ch.History, "\n")[:min(10, len(strings.Split(ch.History, "\n")))], "\n"))
			}
		}
	}
}
