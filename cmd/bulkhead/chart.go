package main

import (
	"fmt"
	"image/color"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Colors of the chart's series.
var (
	colCompleted = color.RGBA{R: 0x1b, G: 0x9e, B: 0x3e, A: 0xff}
	colRejected  = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colDeadline  = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	colRunning   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colWaiting   = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	colServer    = color.RGBA{R: 0x33, G: 0x33, B: 0x33, A: 0xff}
	colP50       = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colP95       = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	colP99       = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colLimit     = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
)

// chartDPI is the resolution of PNG charts: 9 by 12 inches per run.
// Tests lower it: rendering under -race costs seconds per million pixels.
var chartDPI = 96

// pngCanvas writes an image canvas as PNG with fast compression: the
// default level costs several times as much for a file a little smaller.
type pngCanvas struct{ *vgimg.Canvas }

func (c pngCanvas) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(cw, c.Image())
	return cw.n, err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// series is one line of a panel.
type series struct {
	name   string
	color  color.Color
	dashed bool
	pts    plotter.XYs
}

// panel is one plot: a title, a y label and its lines.
type panel struct {
	title, ylabel string
	lines         []series
}

// writeChart draws the runs of rep into path (.png or .svg): one column
// per run, four panels each, second by second: operations completed and
// failed, rejections by cause, running and waiting operations (and server
// transactions on PostgreSQL), and the latency percentiles of completed
// operations. Panels of a row share their y scale, so that the runs
// compare at a glance.
func writeChart(path string, rep *loadReport) error {
	if len(rep.Runs) == 0 {
		return fmt.Errorf("nothing measured")
	}
	const rows = 4
	cols := len(rep.Runs)
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	xmax := 1.0
	for _, r := range rep.Runs {
		xmax = max(xmax, r.ElapsedS)
	}
	legendEntries := map[*plot.Plot]int{}
	for c, r := range rep.Runs {
		for row, pn := range chartPanels(r) {
			p, err := makePlot(pn, xmax)
			if err != nil {
				return err
			}
			title := fmt.Sprintf("%s (%s): %s", r.Name, r.Setup, pn.title)
			p.Title.Text = title
			grid[row][c] = p
			legendEntries[p] = len(pn.lines)
		}
	}
	// One y scale per row, with headroom above the data for the legend
	// (each entry takes about a tenth of a panel's height).
	for row := range grid {
		ymax, entries := 1.0, 0
		for _, p := range grid[row] {
			ymax = max(ymax, p.Y.Max)
			entries = max(entries, legendEntries[p])
		}
		for _, p := range grid[row] {
			p.Y.Min, p.Y.Max = 0, ymax/(1-0.09*float64(entries))
		}
	}

	var captions []string
	if rep.cfg != nil {
		captions = []string{rep.describe()} // what the load was
	}
	return writeGrid(path, vg.Length(cols)*9*vg.Inch, 12*vg.Inch, grid, captions)
}

// writeGrid draws grid (rows of equally sized panels) with captions, one
// line each, centred above it, to path: SVG for a .svg name, PNG otherwise.
func writeGrid(path string, w, h vg.Length, grid [][]*plot.Plot, captions []string) error {
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg":
		canvas = vgsvg.New(w, h)
	default:
		canvas = pngCanvas{vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(chartDPI))}
	}
	dc := draw.New(canvas)
	tiles := draw.Tiles{
		Rows: len(grid), Cols: len(grid[0]),
		PadTop: vg.Points(8 + 20*float64(len(captions))), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(12),
		PadX: vg.Points(24), PadY: vg.Points(18),
	}
	sty := text.Style{
		Color:   color.Black,
		Font:    font.From(plot.DefaultFont, 13),
		XAlign:  draw.XCenter,
		YAlign:  draw.YTop,
		Handler: plot.DefaultTextHandler,
	}
	for i, c := range captions {
		dc.FillText(sty, vg.Point{X: w / 2, Y: h - vg.Points(6+18*float64(i))}, c)
	}
	cvs := plot.Align(grid, tiles, dc)
	for r := range grid {
		for c := range grid[r] {
			grid[r][c].Draw(cvs[r][c])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// chartPanels returns the four panels of a run, top to bottom.
func chartPanels(r *runResult) []panel {
	var done, full, timeout, failed, running, waiting, srvTx, p50, p95, p99 plotter.XYs
	for _, s := range r.Seconds {
		x := float64(s.T) + s.LengthS/2
		rate := func(n int) float64 { return float64(n) / s.LengthS }
		done = append(done, plotter.XY{X: x, Y: rate(s.Completed)})
		full = append(full, plotter.XY{X: x, Y: rate(s.RejectedFull)})
		timeout = append(timeout, plotter.XY{X: x, Y: rate(s.RejectedTimeout)})
		failed = append(failed, plotter.XY{X: x, Y: rate(s.Deadline + s.Other + s.Interrupted)})
		running = append(running, plotter.XY{X: x, Y: s.Running})
		waiting = append(waiting, plotter.XY{X: x, Y: s.Waiting})
		if s.ServerTx != nil {
			srvTx = append(srvTx, plotter.XY{X: x, Y: float64(*s.ServerTx)})
		}
		if s.Latency != nil {
			p50 = append(p50, plotter.XY{X: x, Y: s.Latency.P50})
			p95 = append(p95, plotter.XY{X: x, Y: s.Latency.P95})
			p99 = append(p99, plotter.XY{X: x, Y: s.Latency.P99})
		}
	}
	conc := panel{title: "operations in flight (mean per second)", ylabel: "operations", lines: []series{
		{name: "running", color: colRunning, pts: running},
		{name: "waiting", color: colWaiting, pts: waiting},
	}}
	if len(srvTx) > 0 {
		conc.title = "in flight (mean) and server transactions (most)"
		conc.lines = append(conc.lines, series{name: "server transactions (most)", color: colServer, dashed: true, pts: srvTx})
	}
	limit := float64(r.MaxOpenConns)
	limitName := "MaxOpenConns"
	if r.Policy != nil {
		limit, limitName = float64(r.Policy.MaxConcurrent), "B"
	}
	conc.lines = append(conc.lines, series{name: limitName, color: colLimit, dashed: true,
		pts: plotter.XYs{{X: 0, Y: limit}, {X: r.ElapsedS, Y: limit}}})
	deadline := plotter.XYs{{X: 0, Y: r.DeadlineMs}, {X: r.ElapsedS, Y: r.DeadlineMs}}
	return []panel{
		{title: "operations per second", ylabel: "operations/s", lines: []series{
			{name: "completed", color: colCompleted, pts: done},
			{name: "deadline exceeded or failed", color: colDeadline, pts: failed},
		}},
		{title: "rejections per second", ylabel: "rejections/s", lines: []series{
			{name: "admission full", color: colRejected, pts: full},
			{name: "queue timeout", color: colWaiting, pts: timeout},
		}},
		conc,
		{title: "latency of completed operations", ylabel: "ms", lines: []series{
			{name: "p50", color: colP50, pts: p50},
			{name: "p95", color: colP95, pts: p95},
			{name: "p99", color: colP99, pts: p99},
			{name: "deadline", color: colLimit, dashed: true, pts: deadline},
		}},
	}
}

func makePlot(pn panel, xmax float64) (*plot.Plot, error) {
	p := plot.New()
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = pn.ylabel
	p.X.Min, p.X.Max = 0, xmax
	p.Legend.Top = true
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	for _, s := range pn.lines {
		if len(s.pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(s.pts)
		if err != nil {
			return nil, fmt.Errorf("series %s: %w", s.name, err)
		}
		l.Color = s.color
		l.Width = vg.Points(1.5)
		if s.dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	p.X.Min, p.X.Max = 0, xmax
	p.Y.Tick.Marker = plainTicks{}
	if p.Y.Min > 0 {
		p.Y.Min = 0
	}
	return p, nil
}

// plainTicks are the default ticks labelled without trailing zeros
// (250, not 250.00).
type plainTicks struct{}

func (plainTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = strconv.FormatFloat(t.Value, 'f', -1, 64)
		}
	}
	return ticks
}
