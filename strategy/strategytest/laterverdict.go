package strategytest

import (
	"fmt"
	"strings"
)

// laterVerdict is what one check of the deployment contract found for a
// later entry to judge under a claim of its own: the audit of
// checkConflictBehind (conserves, beside its answers under the contract),
// and the refusals behind the outlast holds (the contract, beside their
// SOLD_OUT answers under no-phantom-sold-out).
type laterVerdict struct {
	ran  bool
	errs []string
}

// failf records one failure for the later entry.
func (v *laterVerdict) failf(format string, args ...any) {
	v.errs = append(v.errs, fmt.Sprintf(format, args...))
}

// judge is the later entry's check: skipped when the check that records
// for it did not run (notRan says which), failed with everything recorded.
func (v *laterVerdict) judge(t tester, notRan string) {
	t.Helper()
	if !v.ran {
		t.Skip(notRan)
	}
	if len(v.errs) > 0 {
		t.Errorf("%s", strings.Join(v.errs, "; "))
	}
}
