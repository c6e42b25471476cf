package compare_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	_ "github.com/reservebench/reservebench/all"
	"github.com/reservebench/reservebench/compare"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Where TestTable28_1 writes. The Markdown and JSON tables are committed and
// hold only deterministic facts; last-run.json is not committed and also
// holds what varies (ranges, timings, histories).
const (
	tableMarkdown = "../docs/table-28-1.md"
	tableJSON     = "../docs/table-28-1.json"
	lastRun       = "last-run.json"
)

// TestTable28_1 runs every scenario against every registered strategy and
// the negative controls, rewrites table 28-1, and fails on any violation of
// a claimed guarantee and on any negative control that is not caught.
func TestTable28_1(t *testing.T) {
	if len(strategy.Registered()) == 0 {
		t.Fatal("no strategy is registered: package all imports none")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv := pgtest.Shared(t)
	newDB := databases(t, srv)

	start := time.Now()
	exclusiveDB := exclusiveDatabases(t)
	rep, err := compare.Run(ctx, compare.Options{Short: testing.Short(), Database: newDB, ExclusiveDatabase: exclusiveDB, Logf: t.Logf, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctl := controls()
	var metas []strategy.Meta
	for _, c := range ctl {
		metas = append(metas, c.Meta)
	}
	ctlRep, err := compare.Run(ctx, compare.Options{
		Strategies: metas,
		Scenarios:  []*strategytest.Scenario{strategytest.MustScenario("expiry-replay"), strategytest.MustScenario("same-user"), strategytest.MustScenario("kill-release")},
		Short:      testing.Short(), Database: newDB, ExclusiveDatabase: exclusiveDB, Logf: t.Logf, Parallel: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range ctl {
		c.StrategyReport = ctlRep.Strategies[i]
		c.Judge()
	}
	rep.Controls = ctl
	rep.Server = serverMajor(t, srv)
	t.Logf("all strategies and controls in %v", time.Since(start).Round(time.Millisecond))

	writeTable(t, rep)

	for _, v := range rep.Violations() {
		t.Error(v)
	}
	for _, c := range ctl {
		for i, e := range c.Expect {
			if !c.Caught[i] {
				t.Errorf("negative control %s (%s) was not caught: want a %s violation in %s; it breaks: %s",
					c.Meta.Name, c.Case, e.Claim, e.Scenario, c.Breaks)
			}
		}
	}
}

// databases gives each strategy its own database on the shared server.
func databases(t *testing.T, srv *pgtest.Server) func(ctx context.Context, name string) (*pgxpool.Pool, *pgxpool.Pool, func(), error) {
	return func(ctx context.Context, name string) (*pgxpool.Pool, *pgxpool.Pool, func(), error) {
		d, err := srv.CreateDatabase(ctx, "rb_compare_"+strings.ReplaceAll(name, "-", "_"))
		if err != nil {
			return nil, nil, nil, err
		}
		db, err := pgtest.OpenPool(ctx, d.DSN, 32)
		if err != nil {
			return nil, nil, nil, err
		}
		admin, err := pgtest.OpenPool(ctx, d.AdminDSN, 4)
		if err != nil {
			db.Close()
			return nil, nil, nil, err
		}
		done := func() {
			db.Close()
			admin.Close()
			if err := srv.DropDatabase(context.Background(), d.Name); err != nil {
				t.Errorf("%v", err)
			}
		}
		return db, admin, done, nil
	}
}

// exclusiveDatabases starts a cluster of the harness's own for the scenarios
// that crash or reconfigure the server; it is stopped when the test ends.
// Without local binaries (a user's DSN, or only Docker) those scenarios are
// reported as not supported.
func exclusiveDatabases(t *testing.T) func(context.Context, string) (*pgxpool.Pool, *pgxpool.Pool, strategytest.ServerControl, func(), error) {
	if os.Getenv(pgtest.EnvDSN) != "" {
		t.Logf("%s is set: the crash and commit-timeout scenarios need a server of their own and are skipped", pgtest.EnvDSN)
		return nil
	}
	var srv *pgtest.Server
	return func(ctx context.Context, name string) (*pgxpool.Pool, *pgxpool.Pool, strategytest.ServerControl, func(), error) {
		if srv == nil {
			s, err := pgtest.Start(ctx, pgtest.Options{})
			if err != nil {
				return nil, nil, nil, nil, err
			}
			t.Cleanup(func() {
				if err := s.Stop(); err != nil {
					t.Errorf("stop the exclusive server: %v", err)
				}
			})
			if s.Kind != pgtest.KindLocal {
				return nil, nil, nil, nil, fmt.Errorf("the exclusive server is a %s server, not a local cluster", s.Kind)
			}
			srv = s
		}
		db, admin, done, err := databases(t, srv)(ctx, name)
		return db, admin, srv, done, err
	}
}

func serverMajor(t *testing.T, srv *pgtest.Server) string {
	m := regexp.MustCompile(`^\d+`).FindString(srv.Version)
	if m == "" {
		t.Fatalf("cannot read the major version from %q", srv.Version)
	}
	return m
}

// writeTable rewrites the committed tables, except under -short, whose
// smaller inputs give other counts: then it writes next to last-run.json.
func writeTable(t *testing.T, rep *compare.Report) {
	md, js := tableMarkdown, tableJSON
	if testing.Short() {
		dir := t.TempDir()
		md, js = filepath.Join(dir, "table-28-1.md"), filepath.Join(dir, "table-28-1.json")
		t.Logf("-short: the committed table is left alone; this run's table is only logged below")
	}
	for path, data := range map[string][]byte{md: rep.Markdown(), js: rep.JSON(false), lastRun: rep.JSON(true)} {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if testing.Short() {
		t.Logf("table 28-1 (-short):\n%s", rep.Markdown())
	} else {
		t.Logf("wrote %s, %s and compare/%s", tableMarkdown, tableJSON, lastRun)
	}
}
