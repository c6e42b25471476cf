package compare

import "testing"

// TestTablePaths: a -short or partial (DSN) run never writes over the
// committed table.
func TestTablePaths(t *testing.T) {
	opts := TableOptions{Markdown: "../docs/table-28-1.md", JSON: "../docs/table-28-1.json", LastRun: "last-run.json"}
	for _, c := range []struct {
		short, partial bool
		md, js         string
	}{
		{false, false, "../docs/table-28-1.md", "../docs/table-28-1.json"},
		{true, false, "table-28-1.short.md", "table-28-1.short.json"},
		{false, true, "table-28-1.partial.md", "table-28-1.partial.json"},
		{true, true, "table-28-1.short.md", "table-28-1.short.json"},
	} {
		md, js, why := tablePaths(opts, c.short, c.partial)
		if md != c.md || js != c.js {
			t.Errorf("short %v, partial %v: %s, %s; want %s, %s", c.short, c.partial, md, js, c.md, c.js)
		}
		if (why == "") != (!c.short && !c.partial) {
			t.Errorf("short %v, partial %v: reason %q", c.short, c.partial, why)
		}
	}
}
