package pgcontrol

import "testing"

func TestWithAppName(t *testing.T) {
	for dsn, want := range map[string]string{
		"host=/tmp port=5432":               "host=/tmp port=5432 application_name=a",
		"postgres://u@h/db":                 "postgres://u@h/db?application_name=a",
		"postgres://u@h/db?sslmode=disable": "postgres://u@h/db?sslmode=disable&application_name=a",
	} {
		if got := WithAppName(dsn, "a"); got != want {
			t.Errorf("WithAppName(%q) = %q, want %q", dsn, got, want)
		}
	}
}
