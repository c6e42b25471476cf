package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The committed run and the hand-written method doc the report links to.
const (
	committedResults = "../../docs/perf/results.json"
	committedMethod  = "../../docs/" + methodDoc
)

// renderFile renders results.json at path the way -render does (plots and
// report into dir) and returns the report.
func renderFile(t *testing.T, path, dir string) []byte {
	t.Helper()
	res, err := loadResults(path)
	if err != nil {
		t.Fatal(err)
	}
	// The same RenderedFrom whatever the temporary path: the report names it.
	res.RenderedFrom = "docs/perf/results.json"
	doc := filepath.Join(dir, "performance.md")
	if err := res.writeReport(dir, doc, func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRenderTwice: the report is a function of results.json alone.
func TestRenderTwice(t *testing.T) {
	a := renderFile(t, committedResults, t.TempDir())
	b := renderFile(t, committedResults, t.TempDir())
	if !bytes.Equal(a, b) {
		t.Fatalf("two renders of %s differ (%d and %d bytes)", committedResults, len(a), len(b))
	}
}

// TestRenderNamesOnlyFromData renders the committed run with every strategy
// renamed: a strategy name that comes out anyway was written into the Go
// code, not computed from the data.
func TestRenderNamesOnlyFromData(t *testing.T) {
	raw, err := os.ReadFile(committedResults)
	if err != nil {
		t.Fatal(err)
	}
	res, err := loadResults(committedResults)
	if err != nil {
		t.Fatal(err)
	}
	names := res.strategies()
	// The names registered today, in case the committed run lacks one.
	for _, n := range []string{"hotrow", "hotrow-repeatable-read", "hotrow-serializable", "slotrows", "memquota", "memquota-recover", "advisorylock", "onetrip", "combine"} {
		if !containsStr(names, n) {
			names = append(names, n)
		}
	}
	// Longest first, so that "memquota-recover" is renamed before "memquota".
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
	renamed := string(raw)
	var fresh []string
	for i, n := range names {
		to := "zz" + string(rune('a'+i)) + "strat"
		renamed = strings.ReplaceAll(renamed, n, to)
		fresh = append(fresh, to)
	}
	for _, n := range names {
		if strings.Contains(renamed, n) {
			t.Fatalf("renaming left %q in the JSON", n)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "results.json")
	if err := os.WriteFile(path, []byte(renamed), 0o644); err != nil {
		t.Fatal(err)
	}
	out := string(renderFile(t, path, dir))
	for _, line := range strings.Split(out, "\n") {
		for _, n := range names {
			if strings.Contains(line, n) {
				t.Errorf("strategy name %q written by the code, not the data:\n%s", n, line)
			}
		}
	}
	for _, n := range fresh {
		if strings.Contains(renamed, n) && !strings.Contains(out, "`"+n+"`") {
			t.Errorf("renamed strategy %q is in the data but not in the report", n)
		}
	}
}

// TestFindingsFollowData removes what a finding rests on and checks that the
// finding goes with it.
func TestFindingsFollowData(t *testing.T) {
	load := func() *results {
		r, err := loadResults(committedResults)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	base := load().render("perf", nil)
	for _, want := range []string{"MultiXact", "*Commits went one at a time.*", "*Holding the lock across a round trip", "admission.Gate` at the same"} {
		if !strings.Contains(base, want) {
			t.Fatalf("the committed run no longer shows %q; pick another finding for this test", want)
		}
	}

	// No MultiXact waits sampled: no MultiXact finding.
	r := load()
	for _, s := range r.Summaries {
		for k := range s.Waits {
			if strings.HasPrefix(k, "LWLock:MultiXact") {
				delete(s.Waits, k)
			}
		}
	}
	if out := r.render("perf", nil); strings.Contains(out, "MultiXact") {
		t.Error("MultiXact named although no MultiXact wait was sampled")
	}

	// Commits that shared flushes: no hot-row finding.
	r = load()
	for _, s := range r.Summaries {
		s.WALSyncs.Median = 0.5
	}
	if out := r.render("perf", nil); strings.Contains(out, "one at a time") || strings.Contains(out, "hot row") {
		t.Error("hot-row finding written although commits shared WAL flushes")
	}

	// No control scripts: nothing said about the controls.
	r = load()
	for k := range r.Caps {
		r.Caps[k] = nil
	}
	var keep []*summary
	for _, s := range r.Summaries {
		if s.Cell.Exp != expControl {
			keep = append(keep, s)
		}
	}
	r.Summaries = keep
	if out := r.render("perf", nil); strings.Contains(out, "update-only") || strings.Contains(out, "round trip makes it worse") {
		t.Error("controls named although none ran")
	}

	// No admission phase: no admission findings.
	r = load()
	keep = nil
	for _, s := range r.Summaries {
		if s.Cell.Exp != expAdmission {
			keep = append(keep, s)
		}
	}
	r.Summaries = keep
	if out := r.render("perf", nil); strings.Contains(out, "admission.Gate` at the same") || strings.Contains(out, "Keeping fewer transactions") {
		t.Error("admission findings written although admission did not run")
	}
}

// TestMethodAnchors: every link into the method doc lands on a heading.
func TestMethodAnchors(t *testing.T) {
	md, err := os.ReadFile(committedMethod)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(md), "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			anchors[slug(h)] = true
		}
	}
	res, err := loadResults(committedResults)
	if err != nil {
		t.Fatal(err)
	}
	out := res.render("perf", nil)
	links := regexp.MustCompile(regexp.QuoteMeta(methodDoc)+`#([^)\s]+)\)`).FindAllStringSubmatch(out, -1)
	if len(links) == 0 {
		t.Fatal("the report links no section of the method doc")
	}
	for _, l := range links {
		if !anchors[l[1]] {
			t.Errorf("link to %s#%s: no such heading", methodDoc, l[1])
		}
	}
}

// slug is GitHub's anchor of a heading: lower case, punctuation dropped
// (but - and _), spaces to hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestRerunnable: only pgbench's abort on PostgreSQL's multixact error is
// run again; every other failure ends the sweep.
func TestRerunnable(t *testing.T) {
	abort := errors.New(`bench: pgbench -n -M prepared -c 32: exit status 2
pgbench: error: client 12 script 0 aborted in command 6 query 0: ERROR:  new multixact has more than one updating member: 0 20[538456 (keysh)]
pgbench: error: Run was aborted; the above results are incomplete.`)
	if !rerunnable(abort) {
		t.Error("the multixact abort is not run again")
	}
	for _, err := range []error{nil, errors.New("bench: pgbench: exit status 2\npgbench: error: client 0 aborted in command 2: ERROR:  relation \"x\" does not exist")} {
		if rerunnable(err) {
			t.Errorf("%v is run again", err)
		}
	}
}

// TestFewerTrialsFrom: the closed loop and its control scripts run
// ExtraTrials at FewerTrialsFrom clients and above, Trials below, and the
// report says so only when such a count was run.
func TestFewerTrialsFrom(t *testing.T) {
	s := &sweep{cfg: config{Trials: 3, ExtraTrials: 2, FewerTrialsFrom: 128, Clients: []int{1, 32, 128}}}
	for _, tc := range []struct {
		c    cell
		want int
	}{
		{cell{Exp: expClosed, Clients: 32}, 3},
		{cell{Exp: expClosed, Clients: 128}, 2},
		{cell{Exp: expControl, Clients: 128}, 2},
		{cell{Exp: expPeak, Clients: 128}, 3},
	} {
		if got := s.trialsOf(tc.c); got != tc.want {
			t.Errorf("%s at %d clients: %d trials, want %d", tc.c.Exp, tc.c.Clients, got, tc.want)
		}
	}
	if got := s.cfg.fewerTrials(); !strings.Contains(got, "2 at 128 clients") {
		t.Errorf("report text %q does not name the fewer trials", got)
	}
	s.cfg.Clients = []int{1, 32}
	if got := s.cfg.fewerTrials(); got != "" {
		t.Errorf("no count at or above 128 ran, yet the report says %q", got)
	}
}

// TestPgbenchPartsOnlyFrom: from 128 clients on, the closed loop runs a
// strategy's own pgbench script only where it has control scripts, and the
// report says so only when such a count ran.
func TestPgbenchPartsOnlyFrom(t *testing.T) {
	cfg := config{PgbenchPartsOnlyFrom: 128, Clients: []int{1, 32, 128}}
	withParts, without := caps{pgbench: true, controls: []string{"update-only"}}, caps{pgbench: true}
	for _, tc := range []struct {
		clients int
		dep     caps
		want    bool
	}{
		{32, without, true},
		{32, withParts, true},
		{128, withParts, true},
		{128, without, false},
	} {
		if got := cfg.pgbenchAt(tc.clients, tc.dep); got != tc.want {
			t.Errorf("at %d clients, controls %v: pgbench %v, want %v", tc.clients, tc.dep.controls, got, tc.want)
		}
	}
	if got := cfg.pgbenchPartsOnly(); !strings.Contains(got, "from 128 clients on, only for the strategies with control scripts") {
		t.Errorf("report text %q does not say where pgbench did not run", got)
	}
	cfg.Clients = []int{1, 32}
	if got := cfg.pgbenchPartsOnly(); got != "" {
		t.Errorf("no count at or above 128 ran, yet the report says %q", got)
	}
	if !(config{Clients: []int{128}}).pgbenchAt(128, without) {
		t.Error("with PgbenchPartsOnlyFrom unset, pgbench must run everywhere")
	}
}

// TestRenderOneClientCount renders the committed run cut down to its
// 1-client points, as a run with -clients 1 leaves it: the plots against
// clients then span one value, which gonum widens to 0 on a log axis and
// panicked on.
func TestRenderOneClientCount(t *testing.T) {
	res, err := loadResults(committedResults)
	if err != nil {
		t.Fatal(err)
	}
	res.Config.Clients = []int{1}
	res.Summaries = slices.DeleteFunc(res.Summaries, func(s *summary) bool { return s.Cell.Clients != 1 })
	res.Trials = slices.DeleteFunc(res.Trials, func(r *record) bool { return r.Cell.Clients != 1 })
	dir := t.TempDir()
	if err := res.writeReport(dir, filepath.Join(dir, "performance.md"), func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
}
