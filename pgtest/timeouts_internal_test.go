package pgtest

import (
	"testing"
	"time"
)

func TestTimeoutSettingsRead(t *testing.T) {
	for _, c := range []struct {
		sql  string
		args []any
		want time.Duration
	}{
		{"SET LOCAL lock_timeout = '5s'", nil, 5 * time.Second},
		{"set statement_timeout to 2500", nil, 2500 * time.Millisecond},
		{"SELECT set_config('lock_timeout', '2 min', true)", nil, 2 * time.Minute},
		{"SELECT set_config('lock_timeout', $1, true)", []any{"750ms"}, 750 * time.Millisecond},
		{"SET LOCAL transaction_timeout = 0", nil, 0},
		{"SET LOCAL idle_in_transaction_session_timeout = '1h'", nil, 0},
		{"UPDATE stock SET available = available - 1", nil, 0},
	} {
		tr := &timeoutTracer{}
		tr.see(c.sql, c.args)
		if got := time.Duration(tr.longest.Load()); got != c.want {
			t.Errorf("%q %v: %v, want %v", c.sql, c.args, got, c.want)
		}
	}
}
