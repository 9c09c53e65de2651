package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/svg"
)

// Colours of the chart's series: distinct hues, none of them the grey of
// the reference lines.
const (
	colCompleted = "#1b9e3e"
	colRejected  = "#d62728"
	colDeadline  = "#9467bd"
	colLate      = "#8c564b"
	colRunning   = "#1f77b4"
	colWaiting   = "#ff7f0e"
	colServer    = "#222222"
	colP50       = "#1f77b4"
	colP95       = "#ff7f0e"
	colP99       = "#d62728"
)

// series is one line of a panel, in data coordinates.
type series struct {
	name string
	st   svg.Stroke
	pts  []svg.Point
	ref  bool // a reference line: drawn first, under the data
}

// panel is one plot: a title, a y label and its lines. Data lines are
// drawn in order, each narrower than the one before, so that where two
// coincide both show.
type panel struct {
	title, ylabel string
	lines         []series
}

// Size of the load chart: a column of four panels per run.
const (
	loadColWidth = 864.0
	loadPanelH   = 288.0
)

// writeChart draws the runs of rep into path as SVG: one column per run,
// four panels each, second by second: operations completed and failed,
// rejections by cause, running and waiting operations (and server
// transactions on PostgreSQL), and the latency percentiles of completed
// operations. Panels of a row share their y scale, so that the runs
// compare at a glance; every legend stands beside its plot area.
func writeChart(path string, rep *loadReport) error {
	b, err := loadChartSVG(rep)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// loadChart is the load chart laid out: what loadChartSVG draws, and what
// the tests check.
type loadChart struct {
	w, h     float64
	captions []string
	xmax     float64
	cells    [][]loadCell // [row][run]
}

type loadCell struct {
	title  string
	pn     panel
	lay    svg.Layout
	ticks  []float64 // y ticks, the last the top of the scale
	ydecim int
}

func layoutLoadChart(rep *loadReport) (*loadChart, error) {
	if len(rep.Runs) == 0 {
		return nil, fmt.Errorf("nothing measured")
	}
	const rows = 4
	c := &loadChart{xmax: 1}
	if rep.cfg != nil {
		c.captions = []string{rep.describe()} // what the load was
	}
	for _, r := range rep.Runs {
		c.xmax = max(c.xmax, r.ElapsedS)
	}
	c.cells = make([][]loadCell, rows)
	legendW := 0.0
	for _, r := range rep.Runs {
		for row, pn := range chartPanels(r) {
			c.cells[row] = append(c.cells[row], loadCell{title: fmt.Sprintf("%s (%s): %s", r.Name, r.Setup, pn.title), pn: pn})
			legendW = max(legendW, svg.LegendWidth(legendOf(pn)))
		}
	}
	top := svg.CaptionsH(len(c.captions))
	c.w = loadColWidth * float64(len(rep.Runs))
	c.h = top + rows*loadPanelH + 8
	for row := range c.cells {
		// One y scale per row, from 0 to a round value above the data.
		ymax := 1.0
		for _, cell := range c.cells[row] {
			for _, s := range cell.pn.lines {
				for _, p := range s.pts {
					ymax = max(ymax, p.Y)
				}
			}
		}
		ticks, dec := svg.NiceTicks(0, ymax*1.04, 5)
		for col := range c.cells[row] {
			cell := &c.cells[row][col]
			cell.ticks, cell.ydecim = ticks, dec
			outer := svg.Box{X: float64(col) * loadColWidth, Y: top + float64(row)*loadPanelH, W: loadColWidth, H: loadPanelH}
			cell.lay = svg.LayoutPanel(outer, legendW)
		}
	}
	return c, nil
}

// legendOf returns a panel's legend: the data series in drawing order,
// then the reference lines.
func legendOf(pn panel) []svg.LegendEntry {
	var data, refs []svg.LegendEntry
	for _, s := range pn.lines {
		e := svg.LegendEntry{Name: s.name, St: s.st}
		if s.ref {
			refs = append(refs, e)
		} else {
			data = append(data, e)
		}
	}
	return append(data, refs...)
}

func loadChartSVG(rep *loadReport) ([]byte, error) {
	c, err := layoutLoadChart(rep)
	if err != nil {
		return nil, err
	}
	d := svg.Page(c.w, c.h, c.captions)
	// The x scale ends with the longest run; the ticks within it.
	xticks, xdec := svg.TicksWithin(c.xmax, 8)
	xscale := c.xmax
	for _, row := range c.cells {
		for _, cell := range row {
			plot := cell.lay.Plot
			d.Comment("panel: " + cell.title)
			d.Text(plot.X, cell.lay.Outer.Y+20, svg.TextStyle{Size: svg.TitleSize, Bold: true}, cell.title)
			d.YAxis(plot, cell.ticks, cell.ydecim, cell.pn.ylabel)
			for _, t := range xticks {
				x := plot.X + t/xscale*plot.W
				d.Line(x, plot.Y, x, plot.Bottom(), svg.Stroke{Color: svg.GridColor, Width: 1})
				d.Text(x, plot.Bottom()+16, svg.TextStyle{Size: svg.FontSize, Anchor: "middle", Color: svg.AxisColor}, svg.TickLabel(t, xdec))
			}
			d.Text(plot.X+plot.W/2, plot.Bottom()+36, svg.TextStyle{Size: svg.FontSize, Anchor: "middle", Color: svg.AxisColor}, "seconds")
			ymax := cell.ticks[len(cell.ticks)-1]
			toPage := func(pts []svg.Point) []svg.Point {
				out := make([]svg.Point, len(pts))
				for i, p := range pts {
					out[i] = svg.Point{X: plot.X + p.X/xscale*plot.W, Y: plot.Bottom() - p.Y/ymax*plot.H}
				}
				return out
			}
			// Reference lines first, under the data.
			for _, s := range cell.pn.lines {
				if s.ref {
					d.Comment("reference: " + s.name)
					d.Polyline(toPage(s.pts), s.st)
				}
			}
			for _, s := range cell.pn.lines {
				if !s.ref {
					d.Comment("series: " + s.name)
					d.Polyline(toPage(s.pts), s.st)
				}
			}
			d.Frame(plot)
			d.DrawLegend(cell.lay.Legend, legendOf(cell.pn))
		}
	}
	return d.Bytes(), nil
}

// chartPanels returns the four panels of a run, top to bottom.
func chartPanels(r *runResult) []panel {
	var done, full, timeout, late, failed, running, waiting, srvTx, p50, p95, p99 []svg.Point
	for _, s := range r.Seconds {
		x := float64(s.T) + s.LengthS/2
		rate := func(n int) float64 { return float64(n) / s.LengthS }
		done = append(done, svg.Point{X: x, Y: rate(s.Completed)})
		full = append(full, svg.Point{X: x, Y: rate(s.RejectedFull)})
		timeout = append(timeout, svg.Point{X: x, Y: rate(s.RejectedTimeout)})
		late = append(late, svg.Point{X: x, Y: rate(s.RejectedDeadline)})
		failed = append(failed, svg.Point{X: x, Y: rate(s.Deadline + s.Other + s.Interrupted)})
		running = append(running, svg.Point{X: x, Y: s.Running})
		waiting = append(waiting, svg.Point{X: x, Y: s.Waiting})
		if s.ServerTx != nil {
			srvTx = append(srvTx, svg.Point{X: x, Y: float64(*s.ServerTx)})
		}
		if s.Latency != nil {
			p50 = append(p50, svg.Point{X: x, Y: s.Latency.P50})
			p95 = append(p95, svg.Point{X: x, Y: s.Latency.P95})
			p99 = append(p99, svg.Point{X: x, Y: s.Latency.P99})
		}
	}
	limit := float64(r.MaxOpenConns)
	limitName := fmt.Sprintf("MaxOpenConns = %d", r.MaxOpenConns)
	if r.Policy != nil {
		limit, limitName = float64(r.Policy.MaxConcurrent), fmt.Sprintf("B = %d", r.Policy.MaxConcurrent)
		if r.Policy.Adaptive {
			limitName = fmt.Sprintf("B = %d, the adaptive ceiling", r.Policy.MaxConcurrent)
		}
	}
	conc := panel{title: "operations in flight (mean per second)", ylabel: "operations", lines: []series{
		{name: limitName, st: svg.RefStroke, ref: true, pts: []svg.Point{{X: 0, Y: limit}, {X: r.ElapsedS, Y: limit}}},
		{name: "running", st: svg.Stroke{Color: colRunning, Width: 3.5}, pts: running},
		{name: "waiting", st: svg.Stroke{Color: colWaiting, Width: 2.2}, pts: waiting},
	}}
	if len(srvTx) > 0 {
		conc.title = "in flight (mean) and server transactions (most)"
		conc.lines = append(conc.lines, series{name: "server transactions (most)", st: svg.Stroke{Color: colServer, Width: 1.3, Dash: "5 3"}, pts: srvTx})
	}
	deadline := []svg.Point{{X: 0, Y: r.DeadlineMs}, {X: r.ElapsedS, Y: r.DeadlineMs}}
	return []panel{
		{title: "operations per second", ylabel: "operations/s", lines: []series{
			{name: "completed", st: svg.Stroke{Color: colCompleted, Width: 3}, pts: done},
			{name: "deadline exceeded or failed", st: svg.Stroke{Color: colDeadline, Width: 1.8}, pts: failed},
		}},
		{title: "rejections per second", ylabel: "rejections/s", lines: []series{
			{name: "admission full", st: svg.Stroke{Color: colRejected, Width: 3}, pts: full},
			{name: "queue timeout", st: svg.Stroke{Color: colWaiting, Width: 1.8}, pts: timeout},
			{name: "would miss deadline", st: svg.Stroke{Color: colLate, Width: 1.2}, pts: late},
		}},
		conc,
		{title: "latency of completed operations", ylabel: "ms", lines: []series{
			{name: fmt.Sprintf("deadline %s ms", strconv.FormatFloat(r.DeadlineMs, 'f', -1, 64)), st: svg.RefStroke, ref: true, pts: deadline},
			{name: "p50", st: svg.Stroke{Color: colP50, Width: 3.2}, pts: p50},
			{name: "p95", st: svg.Stroke{Color: colP95, Width: 2.2}, pts: p95},
			{name: "p99", st: svg.Stroke{Color: colP99, Width: 1.3}, pts: p99},
		}},
	}
}
