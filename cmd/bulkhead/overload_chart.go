package main

import (
	"fmt"
	"image/color"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Colors of the configurations.
var configColors = map[string]color.Color{
	cfgPlain:     color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	cfgSemaphore: color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	cfgGate:      color.RGBA{R: 0x1b, G: 0x9e, B: 0x3e, A: 0xff},
}

// overloadPanel is one panel of the chart: a value of each phase, drawn
// as bars grouped by load, and reference lines.
type overloadPanel struct {
	title, ylabel string
	value         func(*overloadPhase) (float64, bool)
	format        string // of the value labels
	refs          []refLine
}

type refLine struct {
	name  string
	y     float64
	color color.Color
}

// writeOverloadChart draws rep into path (.png or .svg): four panels of
// bars grouped by offered load, one bar per configuration: goodput, p99
// latency of successes, p99 time for a failure to come back, and the most
// transactions the server showed.
func writeOverloadChart(path string, rep *overloadReport) error {
	if len(rep.Phases) == 0 {
		return fmt.Errorf("nothing measured")
	}
	p99 := func(f func(*overloadPhase) *pct) func(*overloadPhase) (float64, bool) {
		return func(ph *overloadPhase) (float64, bool) {
			if v := f(ph); v != nil {
				return v.P99, true
			}
			return 0, false
		}
	}
	grey := color.RGBA{R: 0x66, G: 0x66, B: 0x66, A: 0xff}
	panels := []overloadPanel{
		{
			title: "goodput: committed within the deadline", ylabel: "transactions/s", format: "%.0f",
			value: func(ph *overloadPhase) (float64, bool) { return ph.GoodputPerS, true },
			refs:  []refLine{{name: fmt.Sprintf("capacity C = %.0f/s", rep.Capacity), y: rep.Capacity, color: grey}},
		},
		{
			title: "p99 latency of successes", ylabel: "ms", format: "%.0f",
			value: p99(func(ph *overloadPhase) *pct { return ph.SuccessMs }),
			refs:  []refLine{{name: fmt.Sprintf("deadline %.0f ms", rep.DeadlineMs), y: rep.DeadlineMs, color: grey}},
		},
		{
			title: "p99 time for a failure to come back", ylabel: "ms", format: "%.1f",
			value: p99(func(ph *overloadPhase) *pct { return ph.FailureMs }),
			refs:  []refLine{{name: fmt.Sprintf("deadline %.0f ms", rep.DeadlineMs), y: rep.DeadlineMs, color: grey}},
		},
		{
			title: "most transactions open on the server", ylabel: "transactions", format: "%.0f",
			value: func(ph *overloadPhase) (float64, bool) {
				if ph.ServerMaxTx == nil {
					return 0, false
				}
				return float64(*ph.ServerMaxTx), true
			},
			refs: []refLine{{name: fmt.Sprintf("B = %d", rep.Policy.MaxConcurrent), y: float64(rep.Policy.MaxConcurrent), color: grey}},
		},
	}
	var loads []float64
	var configs []string
	for _, ph := range rep.Phases {
		if !slices.Contains(loads, ph.Load) {
			loads = append(loads, ph.Load)
		}
		if !slices.Contains(configs, ph.Config) {
			configs = append(configs, ph.Config)
		}
	}
	names := make([]string, len(loads))
	for i, l := range loads {
		names[i] = fmt.Sprintf("%s×C (%.0f/s)", fmtLoad(l), l*rep.Capacity)
	}

	const rows, cols = 2, 2
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, pn := range panels {
		p, err := overloadPlot(rep, pn, loads, configs, names)
		if err != nil {
			return err
		}
		grid[i/cols][i%cols] = p
	}

	return writeGrid(path, 14*vg.Inch, 10*vg.Inch, grid, []string{rep.caption(0), rep.caption(1)})
}

// caption returns the chart's caption, line i of two.
func (rep *overloadReport) caption(i int) string {
	if i == 0 {
		db := rep.Database
		if f := strings.Fields(rep.ServerVersion); len(f) > 0 {
			db = "PostgreSQL " + f[0] // without the packager's suffix
		}
		return fmt.Sprintf("Open-loop overload on %s, %d CPUs shared by client and server; %s, deadline %.0f ms",
			db, rep.CPUs, rep.Work, rep.DeadlineMs)
	}
	s := ""
	if rep.ServiceMs != nil {
		s = fmt.Sprintf("unloaded service time S p50 %.1f ms, ", rep.ServiceMs.P50)
	}
	return fmt.Sprintf("%scapacity C %.0f/s; plain: unlimited pool; semaphore: MaxOpenConns %d; gate: B=%d Q=%d wait %.0f ms",
		s, rep.Capacity, rep.Policy.MaxConcurrent, rep.Policy.MaxConcurrent, rep.Policy.MaxQueue, rep.Policy.QueueWaitMs)
}

func overloadPlot(rep *overloadReport, pn overloadPanel, loads []float64, configs, names []string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.Y.Label.Text = pn.ylabel
	p.Y.Tick.Marker = plainTicks{}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	const barWidth = 30
	width := vg.Points(barWidth)
	ymax := 0.0
	var lx []plotter.XY
	var ltext []string
	for ci, name := range configs {
		vals := make(plotter.Values, len(loads))
		for li, l := range loads {
			if ph := rep.phase(l, name); ph != nil {
				if v, ok := pn.value(ph); ok {
					vals[li] = v
					ymax = max(ymax, v)
					lx = append(lx, plotter.XY{X: float64(li), Y: v})
					ltext = append(ltext, fmt.Sprintf(pn.format, v))
					continue
				}
			}
			lx = append(lx, plotter.XY{X: float64(li), Y: 0})
			ltext = append(ltext, "-")
		}
		bc, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, err
		}
		bc.Color = configColors[name]
		bc.LineStyle.Width = 0
		bc.Offset = vg.Points(float64(ci)-float64(len(configs)-1)/2) * barWidth
		p.Add(bc)
		p.Legend.Add(name, bc)
		// The value above each bar.
		start := len(lx) - len(loads)
		labels, err := plotter.NewLabels(plotter.XYLabels{XYs: lx[start:], Labels: ltext[start:]})
		if err != nil {
			return nil, err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].XAlign = draw.XCenter
			labels.TextStyle[i].Font.Size = vg.Points(9)
		}
		labels.Offset = vg.Point{X: bc.Offset, Y: vg.Points(3)}
		p.Add(labels)
	}
	for _, r := range pn.refs {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: r.y}, {X: float64(len(loads)) - 0.5, Y: r.y}})
		if err != nil {
			return nil, err
		}
		l.Color = r.color
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(r.name, l)
		ymax = max(ymax, r.y)
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(loads))-0.5
	// Headroom above the bars for the legend and the labels.
	p.Y.Min, p.Y.Max = 0, max(ymax, 1)*1.45
	return p, nil
}
