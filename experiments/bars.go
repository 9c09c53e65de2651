package main

import (
	"fmt"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/svg"
)

// barPanel is a panel of bars grouped along x (overload: by offered load;
// fleet: by phase), one bar per series in each group, with reference
// lines over them.
type barPanel struct {
	title, ylabel string
	format        string   // of the value above each bar
	groups        []string // labels under the groups
	keys          []string // the groups' names in the SVG's comments; nil: groups
	series        []string
	colors        []string // of each series
	// value is series s's value in group g; ok false draws no bar and
	// labels it "-".
	value func(g, s int) (v float64, ok bool)
	refs  []refLine
}

// refLine is a horizontal reference line of a bar panel.
type refLine struct {
	name string
	y    float64
	st   svg.Stroke
}

// drawBars draws p in lay: the title, the y axis from 0 with room for
// the value labels, the bars with their values, the reference lines and
// the legend beside.
func drawBars(d *svg.Doc, p barPanel, lay svg.Layout, legend []svg.LegendEntry) {
	plot := lay.Plot
	d.Comment("panel: " + p.title)
	d.Text(plot.X, lay.Outer.Y+20, svg.TextStyle{Size: svg.TitleSize, Bold: true}, p.title)
	ymax := 1.0
	for g := range p.groups {
		for s := range p.series {
			if v, ok := p.value(g, s); ok {
				ymax = max(ymax, v)
			}
		}
	}
	for _, r := range p.refs {
		ymax = max(ymax, r.y)
	}
	// Headroom for the value labels above the bars.
	ticks, dec := svg.NiceTicks(0, ymax*1.1, 5)
	top := ticks[len(ticks)-1]
	d.YAxis(plot, ticks, dec, p.ylabel)
	y := func(v float64) float64 { return plot.Bottom() - v/top*plot.H }
	group := plot.W / float64(max(len(p.groups), 1))
	barW := min(36, group*0.8/float64(max(len(p.series), 1)))
	keys := p.keys
	if keys == nil {
		keys = p.groups
	}
	for g, gname := range p.groups {
		cx := plot.X + (float64(g)+0.5)*group
		d.Text(cx, plot.Bottom()+18, svg.TextStyle{Size: svg.FontSize, Anchor: "middle", Color: svg.AxisColor}, gname)
		for s, sname := range p.series {
			x := cx + (float64(s)-float64(len(p.series))/2)*barW
			label, v := "-", 0.0
			if val, ok := p.value(g, s); ok {
				v, label = val, fmt.Sprintf(p.format, val)
			}
			d.Comment(fmt.Sprintf("bar: %s %s", keys[g], sname))
			d.Rect(x+1, y(v), barW-2, plot.Bottom()-y(v), p.colors[s], "")
			d.Text(x+barW/2, y(v)-4, svg.TextStyle{Size: 10, Anchor: "middle"}, label)
		}
	}
	for _, r := range p.refs {
		d.Comment("reference: " + r.name)
		d.Line(plot.X, y(r.y), plot.Right(), y(r.y), r.st)
	}
	d.Frame(plot)
	d.DrawLegend(lay.Legend, legend)
}
