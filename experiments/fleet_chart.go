package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/svg"
)

// The fleet experiment's chart: for each arm beside the baseline, the
// service's transactions on the server over time, with T, the phases, the
// members' starts, stops and kills and, for the fleet, the members' shares
// added up; then bars per phase and arm: goodput (against one process
// holding B = T) and the most server transactions (against T). The p99
// times are in the table. Every legend stands beside its plot area.

// Colours of the arms' bars.
var armColors = map[string]string{
	armOne:       "#7f7f7f",
	armStatic4:   "#d62728",
	armStatic8:   "#ff7f0e",
	armFleet:     "#1b9e3e",
	armPgBouncer: "#1f77b4",
}

// Colours of the members' events.
var eventColors = map[string]string{"start": "#1b9e3e", "stop": "#7f7f7f", "kill": "#d62728"}

var eventNames = map[string]string{"start": "member(s) started", "stop": "member(s) stopped gracefully", "kill": "member killed (SIGKILL)"}

// The look of the time panels' lines.
var (
	fleetTxStroke    = svg.Stroke{Color: "#222222", Width: 1.3}
	fleetShareStroke = svg.Stroke{Color: "#1f77b4", Width: 3.5}
	fleetPhaseStroke = svg.Stroke{Color: "#9a9a9a", Width: 1, Dash: "2 3"}
	fleetRef2Stroke  = svg.Stroke{Color: "#555555", Width: 1.5, Dash: "2 3"}
)

// Size of the fleet chart.
const (
	fleetW       = 1344.0
	fleetTimeH   = 250.0
	fleetBarH    = 330.0
	fleetBandH   = 16.0 // the phase names above a time panel's plot
	fleetEventH  = 12.0 // the event marks under them
	fleetBarCols = 1    // full width: four bars a phase, each labelled
)

// fleetChart is the chart laid out: what fleetChartSVG draws and what the
// tests check.
type fleetChart struct {
	w, h     float64
	captions []string
	xmax     float64 // seconds, the longest arm
	times    []fleetTimeCell
	bars     []fleetBarCell
	groups   []string // the phases the bars compare
	series   []string // the arms they show
}

type fleetTimeCell struct {
	arm    *fleetArm
	title  string
	lay    svg.Layout
	band   svg.Box // phase names and event marks, above the plot
	ticks  []float64
	ydec   int
	legend []svg.LegendEntry
}

type fleetBarCell struct {
	title, ylabel, format string
	value                 func(*fleetPhase) (float64, bool)
	refs                  []refLine
	lay                   svg.Layout
	legend                []svg.LegendEntry
}

func writeFleetChart(path string, rep *fleetReport) error {
	b, err := fleetChartSVG(rep)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func layoutFleetChart(rep *fleetReport) (*fleetChart, error) {
	if !rep.measured() {
		return nil, fmt.Errorf("nothing measured")
	}
	c := &fleetChart{w: fleetW, captions: rep.captions(), xmax: 1}
	for _, a := range rep.Arms {
		if a.Name == armOne || len(a.Phases) == 0 {
			continue
		}
		c.xmax = max(c.xmax, a.Phases[len(a.Phases)-1].EndS)
		c.series = append(c.series, a.Name)
	}
	if len(c.series) == 0 {
		c.series = []string{armOne}
	}
	for _, s := range c.series {
		for _, p := range rep.arm(s).Phases {
			if p.Name != phaseStart && !slices.Contains(c.groups, p.Name) {
				c.groups = append(c.groups, p.Name)
			}
		}
	}
	// The phases in their order.
	var groups []string
	for _, ph := range []string{phaseSteady, phaseDeploy, phaseKill, phaseScaleDown} {
		if slices.Contains(c.groups, ph) {
			groups = append(groups, ph)
		}
	}
	c.groups = groups

	top := svg.CaptionsH(len(c.captions))
	// Time panels, one per arm but the baseline; each legend names what
	// its panel draws.
	timeLegend := func(a *fleetArm) []svg.LegendEntry {
		l := []svg.LegendEntry{{Name: "server transactions (most per 100 ms)", St: fleetTxStroke}}
		if len(a.ShareSum) > 0 {
			l = append(l, svg.LegendEntry{Name: "sum of the members' B", St: fleetShareStroke})
		}
		l = append(l, svg.LegendEntry{Name: fmt.Sprintf("T = %d", rep.Total), St: svg.RefStroke})
		for _, k := range []string{"start", "stop", "kill"} {
			if slices.ContainsFunc(a.Events, func(ev *fleetEvent) bool { return ev.Kind == k }) {
				l = append(l, svg.LegendEntry{Name: eventNames[k], St: svg.Stroke{Color: eventColors[k], Width: 2.5}})
			}
		}
		return l
	}
	timeLegendW := 0.0
	for _, s := range c.series {
		timeLegendW = max(timeLegendW, svg.LegendWidth(timeLegend(rep.arm(s))))
	}
	one := rep.arm(armOne).phase(phaseSteady)
	bars := []fleetBarCell{
		{title: "goodput: committed within the deadline", ylabel: "transactions/s", format: "%.0f",
			value: func(p *fleetPhase) (float64, bool) { return p.GoodputPerS, true }},
		{title: "most transactions of the service open on the server", ylabel: "transactions", format: "%.0f",
			value: func(p *fleetPhase) (float64, bool) {
				if p.ServerMaxTx == nil {
					return 0, false
				}
				return float64(*p.ServerMaxTx), true
			},
			refs: []refLine{{name: fmt.Sprintf("T = %d", rep.Total), y: float64(rep.Total), st: overloadRefStroke}}},
	}
	if one != nil && one.GoodputPerS > 0 && !(len(c.series) == 1 && c.series[0] == armOne) {
		bars[0].refs = []refLine{
			{name: fmt.Sprintf("one process, B=%d: %.0f/s", rep.Total, one.GoodputPerS), y: one.GoodputPerS, st: overloadRefStroke},
			{name: fmt.Sprintf("0.9 × that: %.0f/s", 0.9*one.GoodputPerS), y: 0.9 * one.GoodputPerS, st: fleetRef2Stroke},
		}
	}
	legendW := 0.0
	for i := range bars {
		for _, s := range c.series {
			bars[i].legend = append(bars[i].legend, svg.LegendEntry{Name: s, Fill: armColors[s]})
		}
		for _, r := range bars[i].refs {
			bars[i].legend = append(bars[i].legend, svg.LegendEntry{Name: r.name, St: r.st})
		}
		legendW = max(legendW, svg.LegendWidth(bars[i].legend))
	}
	y := top
	for _, s := range c.series {
		a := rep.arm(s)
		if s == armOne {
			continue
		}
		outer := svg.Box{X: 0, Y: y, W: c.w, H: fleetTimeH}
		lay := svg.LayoutPanel(outer, timeLegendW)
		// The bands above the plot take from its height.
		band := svg.Box{X: lay.Plot.X, Y: lay.Plot.Y, W: lay.Plot.W, H: fleetBandH + fleetEventH}
		lay.Plot.Y += band.H
		lay.Plot.H -= band.H
		lay.Legend.Y = lay.Plot.Y
		ymax := float64(rep.Total)
		for _, p := range a.ServerTx {
			ymax = max(ymax, p.V)
		}
		for _, p := range a.ShareSum {
			ymax = max(ymax, p.V)
		}
		ticks, dec := svg.NiceTicks(0, ymax*1.1, 5)
		c.times = append(c.times, fleetTimeCell{arm: a, lay: lay, band: band, ticks: ticks, ydec: dec, legend: timeLegend(a),
			title: fmt.Sprintf("%s (%s): the service's transactions on the server", a.Name, armBrief(a, rep))})
		y += fleetTimeH
	}
	rows := (len(bars) + fleetBarCols - 1) / fleetBarCols
	for i := range bars {
		outer := svg.Box{X: float64(i%fleetBarCols) * c.w / fleetBarCols, Y: y + float64(i/fleetBarCols)*fleetBarH, W: c.w / fleetBarCols, H: fleetBarH}
		bars[i].lay = svg.LayoutPanel(outer, legendW)
	}
	c.bars = bars
	c.h = y + float64(rows)*fleetBarH + 8
	return c, nil
}

// armBrief describes an arm in a few words, for a panel's title.
func armBrief(a *fleetArm, rep *fleetReport) string {
	switch {
	case a.Name == armPgBouncer:
		return fmt.Sprintf("ungated members through PgBouncer, transaction mode, pool %d", rep.Total)
	case a.Name == armFleet && a.Policy != nil:
		return fmt.Sprintf("a fleet budget T=%d Q=%d, interval %gs", a.Policy.MaxConcurrent, a.Policy.MaxQueue, rep.IntervalS)
	case a.Policy != nil:
		return fmt.Sprintf("each member B=%d Q=%d", a.Policy.MaxConcurrent, a.Policy.MaxQueue)
	}
	return a.Setup
}

// captions are the chart's two caption lines.
func (rep *fleetReport) captions() []string {
	db := "PostgreSQL"
	if f := strings.Fields(rep.ServerVersion); len(f) > 0 {
		db += " " + f[0]
	}
	capacity := float64(rep.Total) / (rep.ServiceMs / 1000)
	return []string{
		fmt.Sprintf("%d members of one service on %s, %d CPUs shared by members and server; T = %d; each request BEGIN; pg_sleep(%g ms); COMMIT, deadline %g ms",
			rep.Members, db, rep.CPUs, rep.Total, rep.ServiceMs, rep.DeadlineMs),
		fmt.Sprintf("offered %.0f/s in all (%g × T/S = %g × %.0f/s), split over the live members; phases start, steady, deploy (+%d, then −1 × %d), kill (SIGKILL 1), scale-down (to %d); fleet interval %gs",
			rep.RatePerS, rep.Load, rep.Load, capacity, rep.Members, rep.Members, max(1, rep.Members/2), rep.IntervalS),
	}
}

func fleetChartSVG(rep *fleetReport) ([]byte, error) {
	c, err := layoutFleetChart(rep)
	if err != nil {
		return nil, err
	}
	d := svg.Page(c.w, c.h, c.captions)
	xticks, xdec := svg.TicksWithin(c.xmax, 10)
	for _, cell := range c.times {
		drawFleetTime(d, cell, c.xmax, xticks, xdec, rep.Total)
	}
	for _, cell := range c.bars {
		colors := make([]string, len(c.series))
		for i, a := range c.series {
			colors[i] = armColors[a]
		}
		drawBars(d, barPanel{
			title: cell.title, ylabel: cell.ylabel, format: cell.format,
			groups: c.groups, series: c.series, colors: colors, refs: cell.refs,
			value: func(g, s int) (float64, bool) {
				if p := rep.arm(c.series[s]).phase(c.groups[g]); p != nil {
					return cell.value(p)
				}
				return 0, false
			},
		}, cell.lay, cell.legend)
	}
	return d.Bytes(), nil
}

// drawFleetTime draws one arm's time panel.
func drawFleetTime(d *svg.Doc, cell fleetTimeCell, xmax float64, xticks []float64, xdec int, total int) {
	plot, a := cell.lay.Plot, cell.arm
	d.Comment("panel: " + cell.title)
	d.Text(plot.X, cell.lay.Outer.Y+20, svg.TextStyle{Size: svg.TitleSize, Bold: true}, cell.title)
	d.YAxis(plot, cell.ticks, cell.ydec, "transactions")
	x := func(s float64) float64 { return plot.X + s/xmax*plot.W }
	ymax := cell.ticks[len(cell.ticks)-1]
	y := func(v float64) float64 { return plot.Bottom() - v/ymax*plot.H }
	for _, t := range xticks {
		d.Line(x(t), plot.Y, x(t), plot.Bottom(), svg.Stroke{Color: svg.GridColor, Width: 1})
		d.Text(x(t), plot.Bottom()+16, svg.TextStyle{Size: svg.FontSize, Anchor: "middle", Color: svg.AxisColor}, svg.TickLabel(t, xdec))
	}
	d.Text(plot.X+plot.W/2, plot.Bottom()+36, svg.TextStyle{Size: svg.FontSize, Anchor: "middle", Color: svg.AxisColor}, "seconds")
	// The phases: their names in the band, their bounds across the plot.
	for _, p := range a.Phases {
		d.Comment("phase: " + p.Name)
		if p.BeginS > 0 {
			d.Line(x(p.BeginS), cell.band.Y, x(p.BeginS), plot.Bottom(), fleetPhaseStroke)
		}
		d.Text((x(p.BeginS)+x(p.EndS))/2, cell.band.Y+fleetBandH-4, svg.TextStyle{Size: 11, Anchor: "middle", Color: svg.AxisColor}, p.Name)
	}
	for _, ev := range a.Events {
		d.Comment(fmt.Sprintf("event: %s %s at %.2f s", ev.Kind, memberList(ev.Members), ev.T))
		d.Line(x(ev.T), cell.band.Y+fleetBandH, x(ev.T), cell.band.Y+fleetBandH+fleetEventH, svg.Stroke{Color: eventColors[ev.Kind], Width: 2.5})
	}
	d.Comment(fmt.Sprintf("reference: T = %d", total))
	d.Line(plot.X, y(float64(total)), plot.Right(), y(float64(total)), svg.RefStroke)
	if len(a.ShareSum) > 0 {
		// A step line: a share holds until the next change; the changes
		// after the last phase (the members' last stops) are not drawn.
		end := min(a.Phases[len(a.Phases)-1].EndS, xmax)
		var pts []svg.Point
		last := 0.0
		for i, p := range a.ShareSum {
			if p.T > end {
				break
			}
			if i > 0 {
				pts = append(pts, svg.Point{X: x(p.T), Y: y(last)})
			}
			pts = append(pts, svg.Point{X: x(p.T), Y: y(p.V)})
			last = p.V
		}
		pts = append(pts, svg.Point{X: x(end), Y: y(last)})
		d.Comment("series: sum of the members' B")
		d.Polyline(pts, fleetShareStroke)
	}
	var tx []svg.Point
	for _, p := range a.ServerTx {
		if p.T <= xmax {
			tx = append(tx, svg.Point{X: x(p.T), Y: y(p.V)})
		}
	}
	d.Comment("series: server transactions")
	d.Polyline(tx, fleetTxStroke)
	d.Frame(plot)
	d.DrawLegend(cell.lay.Legend, cell.legend)
}
