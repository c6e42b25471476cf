package main

import (
	"fmt"
	"strings"

	"github.com/reservebench/reservebench/bench"
)

// skusSection writes the closed loop over many SKUs with Zipf popularity
// beside the single hot SKU at the same client counts.
func (r *results) skusSection(b *strings.Builder, ix index) {
	cfg := r.Config
	ss := ix.filter(func(c cell) bool { return c.Exp == expSKUs })
	if len(ss) == 0 {
		return
	}
	shares := bench.ZipfShares(cfg.ManySKUs, cfg.Zipf)
	top10 := 0.0
	for _, p := range shares[:min(10, len(shares))] {
		top10 += p
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 8. Many SKUs\n\n")
	w("The same closed loop (Go) with each request for one of %d SKUs, drawn from a Zipf distribution of exponent %.2g: the most popular SKU gets %.0f%% of the requests, the ten most popular %.0f%%; each SKU has twice its expected share of the never-sells-out stock, plus 20 units (%s). Beside it, the single hot SKU of section 1 at the same clients.\n\n",
		cfg.ManySKUs, cfg.Zipf, 100*shares[0], 100*top10, see("many-skus", "many SKUs"))
	w("| strategy | clients | goodput /s, %d SKUs | p50 / p99 ms | goodput /s, one SKU | many / one |\n|---|---:|---:|---:|---:|---:|\n", cfg.ManySKUs)
	for _, name := range r.strategies() {
		for _, c := range cfg.ManyClients {
			s := ix.find(expSKUs, name, bench.ToolGo, "", c, "")
			if s == nil {
				continue
			}
			one := ix.find(expClosed, name, bench.ToolGo, "", c, "")
			oneS, rel := "–", "–"
			if one != nil {
				oneS = fmtCI(one.Goodput)
				if one.Goodput.Median > 0 {
					rel = fmt.Sprintf("%.2f", s.Goodput.Median/one.Goodput.Median)
				}
			}
			flag := ""
			if s.SoldOutTrials > 0 {
				flag = fmt.Sprintf(" (a SKU sold out in %d trials)", s.SoldOutTrials)
			}
			w("| `%s` | %d | %s%s | %s / %s | %s | %s |\n", name, c, fmtCI(s.Goodput), flag, ms(s.Held.P50), ms(s.Held.P99), oneS, rel)
		}
	}
	w("\n")
}
