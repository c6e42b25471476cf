package memquota_test

import (
	"flag"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/reservebench/reservebench/internal/pgtest"
	"github.com/reservebench/reservebench/strategy"
	"github.com/reservebench/reservebench/strategy/strategytest"

	_ "github.com/reservebench/reservebench/memquota"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func registered(t *testing.T, name string) strategy.Meta {
	t.Helper()
	meta, ok := strategy.Lookup(name)
	if !ok {
		t.Fatalf("strategy %q is not registered", name)
	}
	return meta
}

// kitChildEnv marks the child process TestConformance/memquota runs the kit in.
const kitChildEnv = "MEMQUOTA_KIT_CHILD"

// kitRestartCheck is the one assertion of the kit that memquota (restart from
// config) fails by design: strategytest's checkConfig restarts every node
// and requires the audit to be unchanged, whether or not the strategy claims
// SurvivesRestart. A node restarted from its configured share gets back the
// unit it sold (available 5 where 4 are free), which is the restart oversell
// this strategy exists to show.
const kitRestartCheck = "Audit after restarting every node"

// TestConformance runs the conformance kit, strategytest.Run, against both
// registrations.
//
// memquota-recover runs it directly and must pass every check.
//
// memquota runs it in a child process (the way strategytest's own
// TestKitRunFailsTheTest does), because the kit fails it on purpose in one
// place: see kitRestartCheck. The child's output must show that check
// failing, in the config subtest, with nothing else failing; every scenario
// must pass, and the boundaries the kit observes (restart oversell, phantom
// sold-out) are logged here. If a later kit judges that check against
// SurvivesRestart, the child passes and so does this test.
func TestConformance(t *testing.T) {
	t.Run("memquota-recover", func(t *testing.T) {
		if os.Getenv(kitChildEnv) == "1" {
			t.Skip("run by the parent process")
		}
		strategytest.Run(t, registered(t, "memquota-recover"), pgtest.Pools)
	})
	t.Run("memquota", func(t *testing.T) {
		meta := registered(t, "memquota")
		if os.Getenv(kitChildEnv) == "1" {
			strategytest.Run(t, meta, pgtest.Pools)
			return
		}
		runKitInChild(t)
	})
}

var (
	failLine  = regexp.MustCompile(`^\s*--- FAIL: (\S+)`)
	runLine   = regexp.MustCompile(`^=== (RUN|CONT|NAME)\s+(\S+)`)
	errorLine = regexp.MustCompile(`^\s+\w+\.go:\d+: `)
)

func runKitInChild(t *testing.T) {
	run := "^TestConformance$/^memquota$"
	if f := flag.Lookup("test.run"); f != nil && f.Value.String() != "" {
		run = f.Value.String() // the child runs what the parent was asked to
	}
	args := []string{"-test.run=" + run, "-test.v", "-test.count=1"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), kitChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	lines := strings.Split(string(out), "\n")
	for _, l := range lines {
		if strings.Contains(l, "boundary observed") || strings.Contains(l, "--- ") {
			t.Log(strings.TrimSpace(l))
		}
	}
	if err == nil {
		if strings.Contains(string(out), "=== RUN   TestConformance/memquota/config") {
			t.Logf("the kit passed memquota: its restart check no longer fails a strategy that does not claim SurvivesRestart")
		}
		return
	}

	allowed := map[string]bool{"TestConformance": true, "TestConformance/memquota": true, "TestConformance/memquota/config": true}
	current, expected := "", 0
	var unexpected []string
	for _, l := range lines {
		if m := runLine.FindStringSubmatch(l); m != nil {
			current = m[2]
			continue
		}
		if m := failLine.FindStringSubmatch(l); m != nil {
			if !allowed[m[1]] {
				unexpected = append(unexpected, "failed: "+m[1])
			}
			continue
		}
		if errorLine.MatchString(l) && current == "TestConformance/memquota/config" {
			if strings.Contains(l, kitRestartCheck) && strings.Contains(l, "Available:5") {
				expected++
				t.Logf("expected kit failure (restart from config re-adds the sold unit): %s", strings.TrimSpace(l))
			} else {
				unexpected = append(unexpected, strings.TrimSpace(l))
			}
		}
	}
	if len(unexpected) > 0 || expected != 1 {
		t.Errorf("the kit failed memquota other than by its known restart check (%d expected failures seen): %s\nchild output:\n%s",
			expected, strings.Join(unexpected, "; "), out)
	}
}
