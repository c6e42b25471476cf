package pgtest

import "testing"

func TestWithDatabaseNamesOne(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		{"host=/tmp/x port=5432 user=postgres dbname=postgres sslmode=disable", "host=/tmp/x port=5432 user=postgres dbname=db1 sslmode=disable"},
		{"dbname=postgres host=/tmp/x", "dbname=db1 host=/tmp/x"},
		{"host=/tmp/x dbname = 'a b\\' c' user=u", "host=/tmp/x dbname=db1 user=u"},
		{"host=/tmp/x user=postgres", "host=/tmp/x user=postgres dbname=db1"},
		{"host=/tmp/x user=mydbname=1", "host=/tmp/x user=mydbname=1 dbname=db1"},
		{"postgres://u@h:5432/postgres?sslmode=disable", "postgres://u@h:5432/db1?sslmode=disable"},
		{"postgresql://u@h", "postgresql://u@h/db1"},
	} {
		if got := withDatabase(c.dsn, "db1"); got != c.want {
			t.Errorf("withDatabase(%q) = %q, want %q", c.dsn, got, c.want)
		}
	}
}
