package main

import (
	"fmt"
	"slices"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/svg"
)

// The capacity-shift chart (--shift): for each load, each configuration's
// goodput over the counted duration, by arrival per timelineStep, with the
// instant the work shifts and the capacity C before it and after it.

const shiftPanelH = 360.0

// shiftChartSVG draws one panel per load of rep.
func shiftChartSVG(rep *overloadReport) []byte {
	cfg := rep.cfg
	captions := []string{
		fmt.Sprintf("Goodput over time as the work per request is multiplied by %v at %v (C %.0f/s, then %.0f/s), %s", rep.Shift, cfg.duration/2, rep.Capacity, rep.CapacityShifted, rep.Database),
		fmt.Sprintf("Poisson arrivals, deadline %v; goodput = committed within the deadline, by arrival per %v; `make overload-shift`", cfg.deadline, timelineStep),
	}
	var entries []svg.LegendEntry
	var seen []string
	for _, ph := range rep.Phases {
		if !slices.Contains(seen, ph.Config) {
			seen = append(seen, ph.Config)
			entries = append(entries, svg.LegendEntry{Name: ph.Config, St: svg.Stroke{Color: rep.color(ph.Config), Width: 2}})
		}
	}
	entries = append(entries, svg.LegendEntry{Name: "capacity C", St: svg.RefStroke})
	top := svg.CaptionsH(len(captions))
	d := svg.Page(overloadW, top+shiftPanelH*float64(len(cfg.loads)), captions)
	for i, load := range cfg.loads {
		l := svg.LayoutPanel(svg.Box{X: 0, Y: top + shiftPanelH*float64(i), W: overloadW, H: shiftPanelH}, svg.LegendWidth(entries))
		ymax := max(rep.Capacity, rep.CapacityShifted)
		for _, ph := range rep.Phases {
			if ph.Load == load {
				for _, v := range ph.Timeline {
					ymax = max(ymax, v)
				}
			}
		}
		yt, yd := svg.NiceTicks(0, ymax*1.05, 5)
		top := yt[len(yt)-1]
		secs := cfg.duration.Seconds()
		x := func(s float64) float64 { return l.Plot.X + s/secs*l.Plot.W }
		y := func(v float64) float64 { return l.Plot.Bottom() - v/top*l.Plot.H }
		d.Text(l.Plot.X, l.Outer.Y+20, svg.TextStyle{Size: svg.FontSize, Bold: true}, fmt.Sprintf("offered %s×C", fmtLoad(load)))
		d.YAxis(l.Plot, yt, yd, "goodput /s")
		xt, xd := svg.TicksWithin(secs, 8)
		for _, t := range xt {
			d.Text(x(t), l.Plot.Bottom()+16, svg.TextStyle{Size: svg.FontSize, Anchor: "middle", Color: svg.AxisColor}, svg.TickLabel(t, xd))
		}
		d.Text(l.Plot.X+l.Plot.W/2, l.Plot.Bottom()+34, svg.TextStyle{Size: svg.FontSize, Anchor: "middle", Color: svg.AxisColor}, "seconds into the counted duration")
		half := secs / 2
		d.Line(x(0), y(rep.Capacity), x(half), y(rep.Capacity), svg.RefStroke)
		d.Line(x(half), y(rep.CapacityShifted), x(secs), y(rep.CapacityShifted), svg.RefStroke)
		d.Line(x(half), l.Plot.Y, x(half), l.Plot.Bottom(), svg.Stroke{Color: "#9a9a9a", Width: 1, Dash: "2 3"})
		for _, ph := range rep.Phases {
			if ph.Load != load {
				continue
			}
			var pts []svg.Point
			step := timelineStep.Seconds()
			for j, v := range ph.Timeline {
				mid := min(float64(j)*step+step/2, secs)
				pts = append(pts, svg.Point{X: x(mid), Y: y(v)})
			}
			d.Polyline(pts, svg.Stroke{Color: rep.color(ph.Config), Width: 2})
		}
		d.Frame(l.Plot)
		d.DrawLegend(l.Legend, entries)
	}
	return d.Bytes()
}
