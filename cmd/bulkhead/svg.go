package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// A small SVG writer for the tool's charts: lines, polylines, rectangles
// and text on a white page, in pixels (96 to the inch), nothing else. It
// keeps the tool free of a plotting library, which cost most of the time
// of a first "go run ./cmd/bulkhead demo".

// svgDoc is an SVG document being written.
type svgDoc struct {
	b    bytes.Buffer
	w, h float64
}

// stroke is how a line is drawn.
type stroke struct {
	color   string
	width   float64
	dash    string  // SVG stroke-dasharray, "" for solid
	opacity float64 // 0: opaque
}

func newSVG(w, h float64) *svgDoc {
	d := &svgDoc{w: w, h: h}
	fmt.Fprintf(&d.b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&d.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="DejaVu Sans, Liberation Sans, Arial, sans-serif">`+"\n",
		num(w), num(h), num(w), num(h))
	d.rect(0, 0, w, h, "#ffffff", "")
	return d
}

// num formats a coordinate: at most two decimals, no trailing zeros.
func num(v float64) string {
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

func (s stroke) attrs() string {
	a := fmt.Sprintf(`stroke="%s" stroke-width="%s" fill="none" stroke-linejoin="round" stroke-linecap="butt"`, s.color, num(s.width))
	if s.dash != "" {
		a += fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
	}
	if s.opacity > 0 && s.opacity < 1 {
		a += fmt.Sprintf(` stroke-opacity="%s"`, num(s.opacity))
	}
	return a
}

// comment writes an XML comment: it names the element that follows, for
// people and tests reading the file.
func (d *svgDoc) comment(s string) {
	s = strings.ReplaceAll(s, "--", "- -")
	fmt.Fprintf(&d.b, "<!-- %s -->\n", s)
}

func (d *svgDoc) line(x1, y1, x2, y2 float64, s stroke) {
	fmt.Fprintf(&d.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" %s/>`+"\n", num(x1), num(y1), num(x2), num(y2), s.attrs())
}

// polyline draws the points joined; nothing for fewer than one point, a
// short tick for a single point so that it still shows.
func (d *svgDoc) polyline(pts []point, s stroke) {
	switch len(pts) {
	case 0:
		return
	case 1:
		p := pts[0]
		d.line(p.x-3, p.y, p.x+3, p.y, s)
		return
	}
	var b strings.Builder
	for i, p := range pts {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(num(p.x) + "," + num(p.y))
	}
	fmt.Fprintf(&d.b, `<polyline points="%s" %s/>`+"\n", b.String(), s.attrs())
}

// rect fills a rectangle; outline, if not "", strokes it one pixel wide.
func (d *svgDoc) rect(x, y, w, h float64, fill, outline string) {
	o := ""
	if outline != "" {
		o = fmt.Sprintf(` stroke="%s" stroke-width="1"`, outline)
	}
	fmt.Fprintf(&d.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"%s/>`+"\n", num(x), num(y), num(max(w, 0)), num(max(h, 0)), fill, o)
}

// textStyle is how a text is set: size in pixels, anchor start, middle or
// end, and whether it is bold.
type textStyle struct {
	size   float64
	anchor string
	bold   bool
	color  string
	rotate bool // vertical, reading upwards
}

func (d *svgDoc) text(x, y float64, st textStyle, s string) {
	var esc bytes.Buffer
	xml.EscapeText(&esc, []byte(s))
	attrs := fmt.Sprintf(`x="%s" y="%s" font-size="%s"`, num(x), num(y), num(st.size))
	if st.anchor != "" && st.anchor != "start" {
		attrs += fmt.Sprintf(` text-anchor="%s"`, st.anchor)
	}
	if st.bold {
		attrs += ` font-weight="bold"`
	}
	if st.color != "" {
		attrs += fmt.Sprintf(` fill="%s"`, st.color)
	}
	if st.rotate {
		attrs += fmt.Sprintf(` transform="rotate(-90 %s %s)"`, num(x), num(y))
	}
	fmt.Fprintf(&d.b, "<text %s>%s</text>\n", attrs, esc.String())
}

// bytes closes the document and returns it.
func (d *svgDoc) bytes() []byte {
	d.b.WriteString("</svg>\n")
	return d.b.Bytes()
}

// textWidth estimates the width of s set at size: about 0.6 em a
// character in a sans-serif face, enough to keep texts apart.
func textWidth(s string, size float64) float64 {
	return float64(len([]rune(s))) * size * 0.6
}

type point struct{ x, y float64 }

// box is a rectangle on the page: x, y its top left corner.
type box struct{ x, y, w, h float64 }

func (b box) right() float64  { return b.x + b.w }
func (b box) bottom() float64 { return b.y + b.h }

// overlaps reports whether b and o share any area.
func (b box) overlaps(o box) bool {
	return b.x < o.right() && o.x < b.right() && b.y < o.bottom() && o.y < b.bottom()
}

// niceTicks returns ticks from 0 (or lo) to at least hi, at a step of 1, 2
// or 5 times a power of ten, about n of them, and the number of decimals
// their labels need.
func niceTicks(lo, hi float64, n int) (ticks []float64, decimals int) {
	if !(hi > lo) || math.IsInf(hi, 0) || math.IsNaN(hi) {
		hi = lo + 1
	}
	raw := (hi - lo) / float64(max(n, 1))
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	decimals = max(0, -int(math.Floor(math.Log10(step)+1e-9)))
	start := math.Floor(lo/step+1e-9) * step
	for i := 0; ; i++ {
		v := start + float64(i)*step
		ticks = append(ticks, v)
		if v >= hi-1e-9*step || i > 1000 {
			break
		}
	}
	return ticks, decimals
}

func tickLabel(v float64, decimals int) string {
	s := strconv.FormatFloat(v, 'f', decimals, 64)
	if s == "-0" {
		s = "0"
	}
	return s
}

// The look shared by the charts.
const (
	chartFontSize   = 12.0
	chartTitleSize  = 13.0
	captionSize     = 14.0
	legendFontSize  = 11.5
	legendLineLen   = 28.0
	legendRowHeight = 18.0
	axisColor       = "#444444"
	gridColor       = "#e3e3e3"
	refColor        = "#8c8c8c"
)

// legendEntry is one line of a legend: a sample of the line (or a filled
// square for bars) and its name.
type legendEntry struct {
	name string
	st   stroke
	fill string // bars: the square's colour
}

// legendWidth is the width a legend of these entries takes.
func legendWidth(entries []legendEntry) float64 {
	w := 0.0
	for _, e := range entries {
		w = max(w, textWidth(e.name, legendFontSize))
	}
	return legendLineLen + 8 + w + 4
}

// drawLegend draws entries top to bottom from the top left corner of at:
// beside the plot area, never over it.
func (d *svgDoc) drawLegend(at box, entries []legendEntry) {
	d.comment("legend")
	for i, e := range entries {
		y := at.y + 10 + float64(i)*legendRowHeight
		if e.fill != "" {
			d.rect(at.x+legendLineLen/2-6, y-6, 12, 12, e.fill, "")
		} else {
			d.line(at.x, y, at.x+legendLineLen, y, e.st)
		}
		d.text(at.x+legendLineLen+8, y+4, textStyle{size: legendFontSize}, e.name)
	}
}

// axes draws the frame, the grid and the y ticks of a plot area whose y
// scale runs from 0 to ymax (a tick value), with ylabel beside it.
func (d *svgDoc) yAxis(plot box, ticks []float64, decimals int, ylabel string) {
	ymax := ticks[len(ticks)-1]
	for _, t := range ticks {
		y := plot.bottom() - t/ymax*plot.h
		d.line(plot.x, y, plot.right(), y, stroke{color: gridColor, width: 1})
		d.text(plot.x-6, y+4, textStyle{size: chartFontSize, anchor: "end", color: axisColor}, tickLabel(t, decimals))
	}
	d.text(plot.x-44, plot.y+plot.h/2, textStyle{size: chartFontSize, anchor: "middle", color: axisColor, rotate: true}, ylabel)
}

// frame draws the plot area's border.
func (d *svgDoc) frame(plot box) {
	d.rect(plot.x, plot.y, plot.w, plot.h, "none", axisColor)
}

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
	st   stroke
}

// drawBars draws p in lay: the title, the y axis from 0 with room for
// the value labels, the bars with their values, the reference lines and
// the legend beside.
func (d *svgDoc) drawBars(p barPanel, lay panelLayout, legend []legendEntry) {
	plot := lay.plot
	d.comment("panel: " + p.title)
	d.text(plot.x, lay.outer.y+20, textStyle{size: chartTitleSize, bold: true}, p.title)
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
	ticks, dec := niceTicks(0, ymax*1.1, 5)
	top := ticks[len(ticks)-1]
	d.yAxis(plot, ticks, dec, p.ylabel)
	y := func(v float64) float64 { return plot.bottom() - v/top*plot.h }
	group := plot.w / float64(max(len(p.groups), 1))
	barW := min(36, group*0.8/float64(max(len(p.series), 1)))
	keys := p.keys
	if keys == nil {
		keys = p.groups
	}
	for g, gname := range p.groups {
		cx := plot.x + (float64(g)+0.5)*group
		d.text(cx, plot.bottom()+18, textStyle{size: chartFontSize, anchor: "middle", color: axisColor}, gname)
		for s, sname := range p.series {
			x := cx + (float64(s)-float64(len(p.series))/2)*barW
			label, v := "-", 0.0
			if val, ok := p.value(g, s); ok {
				v, label = val, fmt.Sprintf(p.format, val)
			}
			d.comment(fmt.Sprintf("bar: %s %s", keys[g], sname))
			d.rect(x+1, y(v), barW-2, plot.bottom()-y(v), p.colors[s], "")
			d.text(x+barW/2, y(v)-4, textStyle{size: 10, anchor: "middle"}, label)
		}
	}
	for _, r := range p.refs {
		d.comment("reference: " + r.name)
		d.line(plot.x, y(r.y), plot.right(), y(r.y), r.st)
	}
	d.frame(plot)
	d.drawLegend(lay.legend, legend)
}
