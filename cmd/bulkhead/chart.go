package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Colours of the chart's series: distinct hues, none of them the grey of
// the reference lines.
const (
	colCompleted = "#1b9e3e"
	colRejected  = "#d62728"
	colDeadline  = "#9467bd"
	colRunning   = "#1f77b4"
	colWaiting   = "#ff7f0e"
	colServer    = "#222222"
	colP50       = "#1f77b4"
	colP95       = "#ff7f0e"
	colP99       = "#d62728"
)

// refStroke is the look of a reference line (a limit such as B or the
// deadline): a wide, pale, dashed band drawn under the data, so that a
// series running along the limit shows on top of it and the band still
// shows around it.
var refStroke = stroke{color: refColor, width: 6, dash: "10 6", opacity: 0.45}

// series is one line of a panel, in data coordinates.
type series struct {
	name string
	st   stroke
	pts  []point
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
	loadColWidth   = 864.0
	loadPanelH     = 288.0
	captionLineH   = 20.0
	panelTitleH    = 30.0
	panelAxisLeft  = 64.0
	panelAxisBelow = 44.0
	panelGap       = 14.0
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

// panelLayout places a panel in outer: the plot area, and the legend to
// its right, outside it.
type panelLayout struct {
	outer, plot, legend box
}

func layoutPanel(outer box, legendW float64) panelLayout {
	plot := box{
		x: outer.x + panelAxisLeft,
		y: outer.y + panelTitleH,
		w: outer.w - panelAxisLeft - panelGap - legendW - 2*panelGap,
		h: outer.h - panelTitleH - panelAxisBelow,
	}
	legend := box{x: plot.right() + panelGap, y: plot.y, w: legendW, h: plot.h}
	return panelLayout{outer: outer, plot: plot, legend: legend}
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
	lay    panelLayout
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
			legendW = max(legendW, legendWidth(legendOf(pn)))
		}
	}
	top := 8 + captionLineH*float64(len(c.captions))
	c.w = loadColWidth * float64(len(rep.Runs))
	c.h = top + rows*loadPanelH + 8
	for row := range c.cells {
		// One y scale per row, from 0 to a round value above the data.
		ymax := 1.0
		for _, cell := range c.cells[row] {
			for _, s := range cell.pn.lines {
				for _, p := range s.pts {
					ymax = max(ymax, p.y)
				}
			}
		}
		ticks, dec := niceTicks(0, ymax*1.04, 5)
		for col := range c.cells[row] {
			cell := &c.cells[row][col]
			cell.ticks, cell.ydecim = ticks, dec
			outer := box{x: float64(col) * loadColWidth, y: top + float64(row)*loadPanelH, w: loadColWidth, h: loadPanelH}
			cell.lay = layoutPanel(outer, legendW)
		}
	}
	return c, nil
}

// legendOf returns a panel's legend: the data series in drawing order,
// then the reference lines.
func legendOf(pn panel) []legendEntry {
	var data, refs []legendEntry
	for _, s := range pn.lines {
		e := legendEntry{name: s.name, st: s.st}
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
	d := newSVG(c.w, c.h)
	for i, s := range c.captions {
		d.text(c.w/2, 8+captionSize+captionLineH*float64(i), textStyle{size: captionSize, anchor: "middle"}, s)
	}
	// The x scale ends with the longest run; the ticks within it.
	xticks, xdec := niceTicks(0, c.xmax, 8)
	xscale := c.xmax
	for len(xticks) > 1 && xticks[len(xticks)-1] > xscale*1.0001 {
		xticks = xticks[:len(xticks)-1]
	}
	for _, row := range c.cells {
		for _, cell := range row {
			plot := cell.lay.plot
			d.comment("panel: " + cell.title)
			d.text(plot.x, cell.lay.outer.y+20, textStyle{size: chartTitleSize, bold: true}, cell.title)
			d.yAxis(plot, cell.ticks, cell.ydecim, cell.pn.ylabel)
			for _, t := range xticks {
				x := plot.x + t/xscale*plot.w
				d.line(x, plot.y, x, plot.bottom(), stroke{color: gridColor, width: 1})
				d.text(x, plot.bottom()+16, textStyle{size: chartFontSize, anchor: "middle", color: axisColor}, tickLabel(t, xdec))
			}
			d.text(plot.x+plot.w/2, plot.bottom()+36, textStyle{size: chartFontSize, anchor: "middle", color: axisColor}, "seconds")
			ymax := cell.ticks[len(cell.ticks)-1]
			toPage := func(pts []point) []point {
				out := make([]point, len(pts))
				for i, p := range pts {
					out[i] = point{plot.x + p.x/xscale*plot.w, plot.bottom() - p.y/ymax*plot.h}
				}
				return out
			}
			// Reference lines first, under the data.
			for _, s := range cell.pn.lines {
				if s.ref {
					d.comment("reference: " + s.name)
					d.polyline(toPage(s.pts), s.st)
				}
			}
			for _, s := range cell.pn.lines {
				if !s.ref {
					d.comment("series: " + s.name)
					d.polyline(toPage(s.pts), s.st)
				}
			}
			d.frame(plot)
			d.drawLegend(cell.lay.legend, legendOf(cell.pn))
		}
	}
	return d.bytes(), nil
}

// chartPanels returns the four panels of a run, top to bottom.
func chartPanels(r *runResult) []panel {
	var done, full, timeout, failed, running, waiting, srvTx, p50, p95, p99 []point
	for _, s := range r.Seconds {
		x := float64(s.T) + s.LengthS/2
		rate := func(n int) float64 { return float64(n) / s.LengthS }
		done = append(done, point{x, rate(s.Completed)})
		full = append(full, point{x, rate(s.RejectedFull)})
		timeout = append(timeout, point{x, rate(s.RejectedTimeout)})
		failed = append(failed, point{x, rate(s.Deadline + s.Other + s.Interrupted)})
		running = append(running, point{x, s.Running})
		waiting = append(waiting, point{x, s.Waiting})
		if s.ServerTx != nil {
			srvTx = append(srvTx, point{x, float64(*s.ServerTx)})
		}
		if s.Latency != nil {
			p50 = append(p50, point{x, s.Latency.P50})
			p95 = append(p95, point{x, s.Latency.P95})
			p99 = append(p99, point{x, s.Latency.P99})
		}
	}
	limit := float64(r.MaxOpenConns)
	limitName := fmt.Sprintf("MaxOpenConns = %d", r.MaxOpenConns)
	if r.Policy != nil {
		limit, limitName = float64(r.Policy.MaxConcurrent), fmt.Sprintf("B = %d", r.Policy.MaxConcurrent)
	}
	conc := panel{title: "operations in flight (mean per second)", ylabel: "operations", lines: []series{
		{name: limitName, st: refStroke, ref: true, pts: []point{{0, limit}, {r.ElapsedS, limit}}},
		{name: "running", st: stroke{color: colRunning, width: 3.5}, pts: running},
		{name: "waiting", st: stroke{color: colWaiting, width: 2.2}, pts: waiting},
	}}
	if len(srvTx) > 0 {
		conc.title = "in flight (mean) and server transactions (most)"
		conc.lines = append(conc.lines, series{name: "server transactions (most)", st: stroke{color: colServer, width: 1.3, dash: "5 3"}, pts: srvTx})
	}
	deadline := []point{{0, r.DeadlineMs}, {r.ElapsedS, r.DeadlineMs}}
	return []panel{
		{title: "operations per second", ylabel: "operations/s", lines: []series{
			{name: "completed", st: stroke{color: colCompleted, width: 3}, pts: done},
			{name: "deadline exceeded or failed", st: stroke{color: colDeadline, width: 1.8}, pts: failed},
		}},
		{title: "rejections per second", ylabel: "rejections/s", lines: []series{
			{name: "admission full", st: stroke{color: colRejected, width: 3}, pts: full},
			{name: "queue timeout", st: stroke{color: colWaiting, width: 1.8}, pts: timeout},
		}},
		conc,
		{title: "latency of completed operations", ylabel: "ms", lines: []series{
			{name: fmt.Sprintf("deadline %s ms", strconv.FormatFloat(r.DeadlineMs, 'f', -1, 64)), st: refStroke, ref: true, pts: deadline},
			{name: "p50", st: stroke{color: colP50, width: 3.2}, pts: p50},
			{name: "p95", st: stroke{color: colP95, width: 2.2}, pts: p95},
			{name: "p99", st: stroke{color: colP99, width: 1.3}, pts: p99},
		}},
	}
}

// checkChartPath checks a --chart value before a run: an .svg file in a
// directory that exists. The charts are SVG only: a .png name is refused
// rather than written as something else.
func checkChartPath(path string) error {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg":
	case ".png":
		return fmt.Errorf("--chart %q: PNG is not supported, want a file name ending in .svg (charts are SVG only)", path)
	default:
		return fmt.Errorf("--chart %q has extension %q, want a file name ending in .svg", path, ext)
	}
	if err := checkDir(path); err != nil {
		return fmt.Errorf("--chart %q: %v", path, err)
	}
	return nil
}
