package strategytest

import (
	"errors"
	"slices"
	"testing"
)

func TestChecksFirst(t *testing.T) {
	parts := []string{"checkConfig", "checkA", "checkB", "checkB", "checkC", "checkIdsPastInt4", "checkSessionsUntouched"}
	id := func(s string) string { return s }
	for _, c := range []struct {
		first []string
		want  []string
	}{
		{nil, parts},
		{[]string{"checkC"}, []string{"checkC", "checkConfig", "checkA", "checkB", "checkB", "checkIdsPastInt4", "checkSessionsUntouched"}},
		// A name's parts move together, in their order; names in theirs.
		{[]string{"checkB", "checkA"}, []string{"checkB", "checkB", "checkA", "checkConfig", "checkC", "checkIdsPastInt4", "checkSessionsUntouched"}},
		// The checks that must end the run stay where they are.
		{[]string{"checkSessionsUntouched", "checkIdsPastInt4"}, parts},
		{[]string{"checkA", "checkA"}, []string{"checkA", "checkConfig", "checkB", "checkB", "checkC", "checkIdsPastInt4", "checkSessionsUntouched"}},
	} {
		got, err := checksFirst(parts, c.first, id)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("checksFirst(%v) = %v, %v; want %v", c.first, got, err, c.want)
		}
	}
	if _, err := checksFirst(parts, []string{"checkA", "checkNoSuch"}, id); !errors.Is(err, ErrUnknownCheck) {
		t.Errorf("checksFirst with an unknown name: %v; want ErrUnknownCheck", err)
	}
}
