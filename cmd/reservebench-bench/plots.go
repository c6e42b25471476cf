package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/reservebench/reservebench/bench"
)

// plotFile is one written plot: its file name and what it shows.
type plotFile struct {
	Name, Title string
}

// plots writes every plot into dir and returns them in the order the
// report embeds them.
func (r *results) plots(dir string) ([]plotFile, error) {
	ix := index{all: r.Summaries}
	var out []plotFile
	add := func(name, title string, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if name != "" {
			out = append(out, plotFile{Name: name, Title: title})
		}
		return nil
	}
	// 1. Goodput of every strategy (Go, closed loop, plenty of stock).
	var series []line
	for _, m := range r.Metas {
		series = append(series, r.curve(ix, expClosed, m.Name, bench.ToolGo, "", "", m.Name))
	}
	if err := add(writeTilesNamed(dir, "goodput.png", "Goodput against clients, every strategy", 1, []*plot.Plot{
		linePlot("Goodput, closed loop, Go (median; bars: 95% CI of the mean)", "successful reservations / s", series, true),
	})); err != nil {
		return nil, err
	}

	// 2. Go against pgbench, per strategy.
	var tiles []*plot.Plot
	for _, m := range r.Metas {
		if !contains(r.Pgbench, m.Name) {
			continue
		}
		tiles = append(tiles, linePlot(m.Name+": Go vs pgbench", "reservations / s", []line{
			r.curve(ix, expClosed, m.Name, bench.ToolGo, "", "", "Go (Reserve)"),
			r.curve(ix, expClosed, m.Name, bench.ToolPgbench, "", "", "pgbench (same SQL)"),
		}, true))
	}
	if len(tiles) > 0 {
		if err := add(writeTilesNamed(dir, "go-vs-pgbench.png", "Go against pgbench running the same SQL", 2, tiles)); err != nil {
			return nil, err
		}
	}

	// 3. Latency quantiles of successes, per strategy.
	tiles = nil
	for _, m := range r.Metas {
		var ls []line
		for _, q := range []string{"p50", "p90", "p99", "max"} {
			ls = append(ls, r.quantileCurve(ix, m.Name, q))
		}
		tiles = append(tiles, linePlot(m.Name+": latency of successes (Go)", "ms", ls, true))
	}
	if err := add(writeTilesNamed(dir, "latency.png", "Latency quantiles of successes against clients", 2, tiles)); err != nil {
		return nil, err
	}

	// 4. Strategies with control scripts: the reservation against its parts.
	for _, m := range r.Metas {
		controls := r.Caps[m.Name]
		if len(controls) == 0 {
			continue
		}
		ls := []line{
			r.curve(ix, expClosed, m.Name, bench.ToolGo, "", "", "reservation, Go"),
			r.curve(ix, expClosed, m.Name, bench.ToolPgbench, "", "", "reservation, pgbench"),
		}
		for _, c := range controls {
			ls = append(ls, r.curve(ix, expControl, m.Name, bench.ToolPgbench, c, "", c+", pgbench"))
		}
		ls = append(ls, r.admitCurves(ix, m.Name)...)
		p := linePlot(m.Name+": the reservation, its parts, and admission", "transactions / s", ls, true)
		if err := add(writeTilesNamed(dir, m.Name+"-collapse.png", m.Name+": the reservation against its parts (pgbench control scripts) and through admission", 1, []*plot.Plot{p})); err != nil {
			return nil, err
		}
	}

	// 5. Admission, per strategy.
	tiles = nil
	for _, m := range r.Metas {
		ad := r.admitCurves(ix, m.Name)
		if len(ad) == 0 {
			continue
		}
		ls := append([]line{r.curve(ix, expClosed, m.Name, bench.ToolGo, "", "", "no admission")}, ad...)
		tiles = append(tiles, linePlot(m.Name+": goodput with admission", "successful reservations / s", ls, true))
	}
	if len(tiles) > 0 {
		if err := add(writeTilesNamed(dir, "admission.png", "Goodput through admission.Gate against clients", 2, tiles)); err != nil {
			return nil, err
		}
	}

	// 6. What the backends were doing (sampled), per strategy, Go runs.
	tiles = nil
	for _, m := range r.Metas {
		if p := r.waitsPlot(ix, m.Name); p != nil {
			tiles = append(tiles, p)
		}
	}
	if len(tiles) > 0 {
		if err := add(writeTilesNamed(dir, "waits.png", "What the database's backends were doing, mean per sample (Go runs)", 2, tiles)); err != nil {
			return nil, err
		}
	}

	// 7. Open loop: latency against offered load.
	var ls []line
	for _, m := range r.Metas {
		l := line{label: m.Name}
		for _, s := range ix.filter(func(c cell) bool { return c.Exp == expOpen && c.Strategy == m.Name && c.Tool == bench.ToolGo }) {
			if s.Held.N > 0 {
				l.pts = append(l.pts, pt{x: s.Cell.Load, y: s.Held.P99})
			}
		}
		sort.Slice(l.pts, func(i, j int) bool { return l.pts[i].x < l.pts[j].x })
		if len(l.pts) > 0 {
			ls = append(ls, l)
		}
	}
	if len(ls) > 0 {
		p := linePlot("Open loop (Go): p99 latency from the planned send time", "ms", ls, false)
		p.X.Label.Text = "offered load (fraction of the strategy's peak closed-loop goodput)"
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		if err := add(writeTilesNamed(dir, "open-loop.png", "Open loop: p99 latency against offered load", 1, []*plot.Plot{p})); err != nil {
			return nil, err
		}
	}
	return out, nil
}

type pt struct{ x, y, lo, hi float64 }

type line struct {
	label  string
	pts    []pt
	dashed bool
}

// curve is a metric's median and CI against clients for one kind of cell.
func (r *results) curve(ix index, exp, strat string, tool bench.Tool, script, admit, label string) line {
	l := line{label: label, dashed: tool == bench.ToolPgbench}
	for _, s := range ix.filter(func(c cell) bool {
		return c.Exp == exp && c.Strategy == strat && c.Tool == tool && c.Script == script && c.Admit == admit
	}) {
		g := s.Goodput
		if s.Cell.Script != "" || s.Cell.Tool == bench.ToolPgbench {
			g = s.Throughput
		}
		l.pts = append(l.pts, pt{x: float64(s.Cell.Clients), y: g.Median, lo: g.Lo, hi: g.Hi})
	}
	sort.Slice(l.pts, func(i, j int) bool { return l.pts[i].x < l.pts[j].x })
	return l
}

func (r *results) admitCurves(ix index, strat string) []line {
	byAdmit := map[string]bool{}
	for _, s := range ix.filter(func(c cell) bool { return c.Exp == expAdmission && c.Strategy == strat }) {
		byAdmit[s.Cell.Admit] = true
	}
	var names []string
	for n := range byAdmit {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []line
	for _, n := range names {
		out = append(out, r.curve(ix, expAdmission, strat, bench.ToolGo, "", n, "Go, admission "+n))
	}
	return out
}

func (r *results) quantileCurve(ix index, strat, q string) line {
	l := line{label: q}
	for _, s := range ix.filter(func(c cell) bool {
		return c.Exp == expClosed && c.Strategy == strat && c.Tool == bench.ToolGo
	}) {
		if s.Held.N == 0 {
			continue
		}
		v := map[string]float64{"p50": s.Held.P50, "p90": s.Held.P90, "p99": s.Held.P99, "max": s.Held.Max}[q]
		l.pts = append(l.pts, pt{x: float64(s.Cell.Clients), y: v})
	}
	sort.Slice(l.pts, func(i, j int) bool { return l.pts[i].x < l.pts[j].x })
	return l
}

// linePlot draws lines with error bars against clients on log-log axes;
// nil when no line has a point (a sweep whose experiments did not produce
// this plot's: a log axis cannot span nothing).
func linePlot(title, ylabel string, ls []line, clientsAxis bool) *plot.Plot {
	if !slices.ContainsFunc(ls, func(l line) bool { return len(l.pts) > 0 }) {
		return nil
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	if clientsAxis {
		p.X.Label.Text = "clients"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = clientTicks{}
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Legend.Top = true
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	// The axis spans the medians (from half the lowest to eight times the
	// highest: room for the legend on a log axis); an error bar reaching
	// below is cut at the axis, not drawn down to zero.
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, l := range ls {
		for _, q := range l.pts {
			if q.y > 0 {
				ymin, ymax = math.Min(ymin, q.y), math.Max(ymax, math.Max(q.y, q.hi))
			}
		}
	}
	if !math.IsInf(ymin, 0) && clientsAxis {
		p.Y.Min, p.Y.Max = ymin/2, ymax*8
	}
	if clientsAxis {
		// gonum widens a range of one value by 1 each way, to 0 for one
		// client, which a log axis cannot show (a run with -clients 1).
		xmin, xmax := math.Inf(1), math.Inf(-1)
		for _, l := range ls {
			for _, q := range l.pts {
				xmin, xmax = math.Min(xmin, q.x), math.Max(xmax, q.x)
			}
		}
		if xmin == xmax && xmin > 0 {
			p.X.Min, p.X.Max = xmin/2, xmax*2
		}
	}
	floor := math.Max(ymin/2, 1e-3)
	if math.IsInf(floor, 0) {
		floor = 1e-3
	}
	for i, l := range ls {
		if len(l.pts) == 0 {
			continue
		}
		xys := make(plotter.XYs, len(l.pts))
		errs := make(plotter.YErrors, len(l.pts))
		withErr := false
		for j, q := range l.pts {
			y := math.Max(q.y, floor)
			xys[j] = plotter.XY{X: q.x, Y: y}
			if q.hi > q.lo {
				withErr = true
				lo := math.Max(q.lo, floor)
				errs[j].Low = math.Max(y-lo, 0)
				errs[j].High = math.Max(q.hi-y, 0)
			}
		}
		ln, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			continue
		}
		c := plotutil.Color(i)
		ln.Color, pts.Color = c, c
		pts.Shape = plotutil.Shape(i)
		if l.dashed {
			ln.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(ln, pts)
		p.Legend.Add(l.label, ln, pts)
		if withErr {
			eb, err := plotter.NewYErrorBars(struct {
				plotter.XYs
				plotter.YErrors
			}{xys, errs})
			if err == nil {
				eb.Color = c
				p.Add(eb)
			}
		}
	}
	return p
}

// clientTicks marks the client counts 1, 2, 4, ... on a log axis.
type clientTicks struct{}

func (clientTicks) Ticks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for v := 1.0; v <= max*1.01; v *= 2 {
		if v >= min*0.99 {
			ts = append(ts, plot.Tick{Value: v, Label: strconv.Itoa(int(v))})
		}
	}
	return ts
}

// waitsPlot stacks the mean number of backends per label for each client
// count of a strategy's Go closed-loop runs.
func (r *results) waitsPlot(ix index, strat string) *plot.Plot {
	ss := ix.filter(func(c cell) bool { return c.Exp == expClosed && c.Strategy == strat && c.Tool == bench.ToolGo })
	if len(ss) == 0 || len(ss[0].Waits) == 0 {
		return nil
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].Cell.Clients < ss[j].Cell.Clients })
	total := map[string]float64{}
	for _, s := range ss {
		for k, v := range s.Waits {
			total[k] += v / float64(s.Cell.Clients)
		}
	}
	labels := bench.Top(total)
	const keep = 7
	if len(labels) > keep {
		labels = append(labels[:keep], "other")
	}
	p := plot.New()
	p.Title.Text = strat + ": backends by state (share of clients)"
	p.Y.Label.Text = "share of the client count"
	p.X.Label.Text = "clients"
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = strconv.Itoa(s.Cell.Clients)
	}
	var below *plotter.BarChart
	for i, lab := range labels {
		vals := make(plotter.Values, len(ss))
		for j, s := range ss {
			if lab == "other" {
				sum := 0.0
				for k, v := range s.Waits {
					if !containsStr(labels[:len(labels)-1], k) {
						sum += v
					}
				}
				vals[j] = sum / float64(s.Cell.Clients)
			} else {
				vals[j] = s.Waits[lab] / float64(s.Cell.Clients)
			}
		}
		bc, err := plotter.NewBarChart(vals, vg.Points(36))
		if err != nil {
			return nil
		}
		bc.Color = palette(i)
		bc.LineStyle.Width = 0
		if below != nil {
			bc.StackOn(below)
		}
		below = bc
		p.Add(bc)
		p.Legend.Add(lab, bc)
	}
	p.NominalX(names...)
	p.Legend.Top, p.Legend.Left = true, true
	p.Y.Min, p.Y.Max = 0, 1.75 // the legend sits above the bars
	return p
}

func palette(i int) color.Color {
	cs := []color.Color{
		color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
		color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
		color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}, color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	}
	return cs[i%len(cs)]
}

// writeTilesNamed is writeTiles into dir/name; it returns no name when
// there was nothing to draw.
func writeTilesNamed(dir, name, title string, cols int, ps []*plot.Plot) (string, string, error) {
	ps = slices.DeleteFunc(slices.Clone(ps), func(p *plot.Plot) bool { return p == nil })
	if len(ps) == 0 {
		return "", "", nil
	}
	_, _, err := writeTiles(filepath.Join(dir, name), cols, ps)
	return name, title, err
}

// drawPNGs off makes writeTiles write nothing (the report still names the
// plots). Only the tests under the race detector turn it off: drawing is
// single-threaded, 20 times slower there (a minute of make test), and
// those tests compare the report, not the pictures.
var drawPNGs = true

// writeTiles draws plots on a grid of cols columns into one PNG; a nil plot
// (linePlot's when it had no point to draw) is left out.
func writeTiles(path string, cols int, ps []*plot.Plot) (string, string, error) {
	ps = slices.DeleteFunc(slices.Clone(ps), func(p *plot.Plot) bool { return p == nil })
	if len(ps) == 0 || !drawPNGs {
		return "", "", nil
	}
	if cols > len(ps) {
		cols = len(ps)
	}
	rows := (len(ps) + cols - 1) / cols
	const tileW, tileH = 7 * vg.Inch, 4.5 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(tileW*vg.Length(cols), tileH*vg.Length(rows)), vgimg.UseDPI(96))
	dc := draw.New(img)
	grid := make([][]*plot.Plot, rows)
	for j := range grid {
		grid[j] = make([]*plot.Plot, cols)
		for i := range grid[j] {
			if k := j*cols + i; k < len(ps) {
				grid[j][i] = ps[k]
			}
		}
	}
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, t, dc)
	for j := range grid {
		for i := range grid[j] {
			if grid[j][i] != nil {
				grid[j][i].Draw(canvases[j][i])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return "", "", err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return "", "", err
	}
	return "", "", f.Close()
}

func contains(xs []string, x string) bool { return containsStr(xs, x) }

func containsStr(xs []string, x string) bool {
	for _, s := range xs {
		if s == x {
			return true
		}
	}
	return false
}
