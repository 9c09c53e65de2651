package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
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
	fleetTxStroke    = stroke{color: colServer, width: 1.3}
	fleetShareStroke = stroke{color: "#1f77b4", width: 3.5}
	fleetPhaseStroke = stroke{color: "#9a9a9a", width: 1, dash: "2 3"}
	fleetRef2Stroke  = stroke{color: "#555555", width: 1.5, dash: "2 3"}
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
	lay    panelLayout
	band   box // phase names and event marks, above the plot
	ticks  []float64
	ydec   int
	legend []legendEntry
}

type fleetBarCell struct {
	title, ylabel, format string
	value                 func(*fleetPhase) (float64, bool)
	refs                  []refLine
	lay                   panelLayout
	legend                []legendEntry
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

	top := 8 + captionLineH*float64(len(c.captions))
	// Time panels, one per arm but the baseline; each legend names what
	// its panel draws.
	timeLegend := func(a *fleetArm) []legendEntry {
		l := []legendEntry{{name: "server transactions (most per 100 ms)", st: fleetTxStroke}}
		if len(a.ShareSum) > 0 {
			l = append(l, legendEntry{name: "sum of the members' B", st: fleetShareStroke})
		}
		l = append(l, legendEntry{name: fmt.Sprintf("T = %d", rep.Total), st: refStroke})
		for _, k := range []string{"start", "stop", "kill"} {
			if slices.ContainsFunc(a.Events, func(ev *fleetEvent) bool { return ev.Kind == k }) {
				l = append(l, legendEntry{name: eventNames[k], st: stroke{color: eventColors[k], width: 2.5}})
			}
		}
		return l
	}
	timeLegendW := 0.0
	for _, s := range c.series {
		timeLegendW = max(timeLegendW, legendWidth(timeLegend(rep.arm(s))))
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
			bars[i].legend = append(bars[i].legend, legendEntry{name: s, fill: armColors[s]})
		}
		for _, r := range bars[i].refs {
			bars[i].legend = append(bars[i].legend, legendEntry{name: r.name, st: r.st})
		}
		legendW = max(legendW, legendWidth(bars[i].legend))
	}
	y := top
	for _, s := range c.series {
		a := rep.arm(s)
		if s == armOne {
			continue
		}
		outer := box{x: 0, y: y, w: c.w, h: fleetTimeH}
		lay := layoutPanel(outer, timeLegendW)
		// The bands above the plot take from its height.
		band := box{x: lay.plot.x, y: lay.plot.y, w: lay.plot.w, h: fleetBandH + fleetEventH}
		lay.plot.y += band.h
		lay.plot.h -= band.h
		lay.legend.y = lay.plot.y
		ymax := float64(rep.Total)
		for _, p := range a.ServerTx {
			ymax = max(ymax, p.V)
		}
		for _, p := range a.ShareSum {
			ymax = max(ymax, p.V)
		}
		ticks, dec := niceTicks(0, ymax*1.1, 5)
		c.times = append(c.times, fleetTimeCell{arm: a, lay: lay, band: band, ticks: ticks, ydec: dec, legend: timeLegend(a),
			title: fmt.Sprintf("%s (%s): the service's transactions on the server", a.Name, armBrief(a, rep))})
		y += fleetTimeH
	}
	rows := (len(bars) + fleetBarCols - 1) / fleetBarCols
	for i := range bars {
		outer := box{x: float64(i%fleetBarCols) * c.w / fleetBarCols, y: y + float64(i/fleetBarCols)*fleetBarH, w: c.w / fleetBarCols, h: fleetBarH}
		bars[i].lay = layoutPanel(outer, legendW)
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
	d := newSVG(c.w, c.h)
	for i, s := range c.captions {
		d.text(c.w/2, 8+captionSize+captionLineH*float64(i), textStyle{size: captionSize, anchor: "middle"}, s)
	}
	xticks, xdec := niceTicks(0, c.xmax, 10)
	for len(xticks) > 1 && xticks[len(xticks)-1] > c.xmax*1.0001 {
		xticks = xticks[:len(xticks)-1]
	}
	for _, cell := range c.times {
		drawFleetTime(d, cell, c.xmax, xticks, xdec, rep.Total)
	}
	for _, cell := range c.bars {
		colors := make([]string, len(c.series))
		for i, a := range c.series {
			colors[i] = armColors[a]
		}
		d.drawBars(barPanel{
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
	return d.bytes(), nil
}

// drawFleetTime draws one arm's time panel.
func drawFleetTime(d *svgDoc, cell fleetTimeCell, xmax float64, xticks []float64, xdec int, total int) {
	plot, a := cell.lay.plot, cell.arm
	d.comment("panel: " + cell.title)
	d.text(plot.x, cell.lay.outer.y+20, textStyle{size: chartTitleSize, bold: true}, cell.title)
	d.yAxis(plot, cell.ticks, cell.ydec, "transactions")
	x := func(s float64) float64 { return plot.x + s/xmax*plot.w }
	ymax := cell.ticks[len(cell.ticks)-1]
	y := func(v float64) float64 { return plot.bottom() - v/ymax*plot.h }
	for _, t := range xticks {
		d.line(x(t), plot.y, x(t), plot.bottom(), stroke{color: gridColor, width: 1})
		d.text(x(t), plot.bottom()+16, textStyle{size: chartFontSize, anchor: "middle", color: axisColor}, tickLabel(t, xdec))
	}
	d.text(plot.x+plot.w/2, plot.bottom()+36, textStyle{size: chartFontSize, anchor: "middle", color: axisColor}, "seconds")
	// The phases: their names in the band, their bounds across the plot.
	for _, p := range a.Phases {
		d.comment("phase: " + p.Name)
		if p.BeginS > 0 {
			d.line(x(p.BeginS), cell.band.y, x(p.BeginS), plot.bottom(), fleetPhaseStroke)
		}
		d.text((x(p.BeginS)+x(p.EndS))/2, cell.band.y+fleetBandH-4, textStyle{size: 11, anchor: "middle", color: axisColor}, p.Name)
	}
	for _, ev := range a.Events {
		d.comment(fmt.Sprintf("event: %s %s at %.2f s", ev.Kind, memberList(ev.Members), ev.T))
		d.line(x(ev.T), cell.band.y+fleetBandH, x(ev.T), cell.band.y+fleetBandH+fleetEventH, stroke{color: eventColors[ev.Kind], width: 2.5})
	}
	d.comment(fmt.Sprintf("reference: T = %d", total))
	d.line(plot.x, y(float64(total)), plot.right(), y(float64(total)), refStroke)
	if len(a.ShareSum) > 0 {
		// A step line: a share holds until the next change; the changes
		// after the last phase (the members' last stops) are not drawn.
		end := min(a.Phases[len(a.Phases)-1].EndS, xmax)
		var pts []point
		last := 0.0
		for i, p := range a.ShareSum {
			if p.T > end {
				break
			}
			if i > 0 {
				pts = append(pts, point{x(p.T), y(last)})
			}
			pts = append(pts, point{x(p.T), y(p.V)})
			last = p.V
		}
		pts = append(pts, point{x(end), y(last)})
		d.comment("series: sum of the members' B")
		d.polyline(pts, fleetShareStroke)
	}
	var tx []point
	for _, p := range a.ServerTx {
		if p.T <= xmax {
			tx = append(tx, point{x(p.T), y(p.V)})
		}
	}
	d.comment("series: server transactions")
	d.polyline(tx, fleetTxStroke)
	d.frame(plot)
	d.drawLegend(cell.lay.legend, cell.legend)
}
