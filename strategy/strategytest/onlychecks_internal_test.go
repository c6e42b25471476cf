package strategytest

import (
	"errors"
	"slices"
	"testing"
)

func TestOnlyChecks(t *testing.T) {
	parts := []string{"checkConfig", "checkA", "checkB", "checkB", "checkC", "checkSessionsUntouched"}
	id := func(s string) string { return s }
	for _, c := range []struct {
		names, want []string
	}{
		{nil, parts},
		{[]string{"checkC"}, []string{"checkC"}},
		// A name's parts go together, in their order; names in theirs.
		{[]string{"checkB", "checkA"}, []string{"checkB", "checkB", "checkA"}},
		{[]string{"checkA", "checkSessionsUntouched"}, []string{"checkA", "checkSessionsUntouched"}},
		{[]string{"checkA", "checkA"}, []string{"checkA"}},
	} {
		got, err := onlyChecks(parts, c.names, id)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("onlyChecks(%v) = %v, %v; want %v", c.names, got, err, c.want)
		}
	}
	if _, err := onlyChecks(parts, []string{"checkA", "checkNoSuch"}, id); !errors.Is(err, ErrUnknownCheck) {
		t.Errorf("onlyChecks with an unknown name: %v; want ErrUnknownCheck", err)
	}
}
