// Package svg is a small SVG writer for the charts of the bulkhead tool
// and of the experiments: lines, polylines, rectangles and text on a white
// page, in pixels (96 to the inch), nothing else, and the layout of a
// panel with its legend beside it. It keeps the tool free of a plotting
// library, which cost most of the time of a first "go run ./cmd/bulkhead
// demo".
package svg

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Doc is an SVG document being written.
type Doc struct {
	b bytes.Buffer
}

// Stroke is how a line is drawn.
type Stroke struct {
	Color   string
	Width   float64
	Dash    string  // SVG stroke-dasharray, "" for solid
	Opacity float64 // 0: opaque
}

// New starts a document of w × h pixels, white.
func New(w, h float64) *Doc {
	d := &Doc{}
	fmt.Fprintf(&d.b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&d.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="DejaVu Sans, Liberation Sans, Arial, sans-serif">`+"\n",
		Num(w), Num(h), Num(w), Num(h))
	d.Rect(0, 0, w, h, "#ffffff", "")
	return d
}

// Page starts a document of w × h pixels with captions centred at its
// top, one a line; CaptionsH(len(captions)) is the height they take.
func Page(w, h float64, captions []string) *Doc {
	d := New(w, h)
	for i, c := range captions {
		d.Text(w/2, 8+CaptionSize+CaptionLineH*float64(i), TextStyle{Size: CaptionSize, Anchor: "middle"}, c)
	}
	return d
}

// CaptionsH is the height n captions take at the top of a page.
func CaptionsH(n int) float64 { return 8 + CaptionLineH*float64(n) }

// TicksWithin returns about n ticks of an x scale from 0 to xmax, none
// beyond it, and the decimals their labels need.
func TicksWithin(xmax float64, n int) (ticks []float64, decimals int) {
	ticks, decimals = NiceTicks(0, xmax, n)
	for len(ticks) > 1 && ticks[len(ticks)-1] > xmax*1.0001 {
		ticks = ticks[:len(ticks)-1]
	}
	return ticks, decimals
}

// Num formats a coordinate: at most two decimals, no trailing zeros.
func Num(v float64) string {
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

func (s Stroke) attrs() string {
	a := fmt.Sprintf(`stroke="%s" stroke-width="%s" fill="none" stroke-linejoin="round" stroke-linecap="butt"`, s.Color, Num(s.Width))
	if s.Dash != "" {
		a += fmt.Sprintf(` stroke-dasharray="%s"`, s.Dash)
	}
	if s.Opacity > 0 && s.Opacity < 1 {
		a += fmt.Sprintf(` stroke-opacity="%s"`, Num(s.Opacity))
	}
	return a
}

// Comment writes an XML comment: it names the element that follows, for
// people and tests reading the file.
func (d *Doc) Comment(s string) {
	s = strings.ReplaceAll(s, "--", "- -")
	fmt.Fprintf(&d.b, "<!-- %s -->\n", s)
}

// Line draws a line.
func (d *Doc) Line(x1, y1, x2, y2 float64, s Stroke) {
	fmt.Fprintf(&d.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" %s/>`+"\n", Num(x1), Num(y1), Num(x2), Num(y2), s.attrs())
}

// Polyline draws the points joined; nothing for fewer than one point, a
// short tick for a single point so that it still shows.
func (d *Doc) Polyline(pts []Point, s Stroke) {
	switch len(pts) {
	case 0:
		return
	case 1:
		p := pts[0]
		d.Line(p.X-3, p.Y, p.X+3, p.Y, s)
		return
	}
	var b strings.Builder
	for i, p := range pts {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(Num(p.X) + "," + Num(p.Y))
	}
	fmt.Fprintf(&d.b, `<polyline points="%s" %s/>`+"\n", b.String(), s.attrs())
}

// Rect fills a rectangle; outline, if not "", strokes it one pixel wide.
func (d *Doc) Rect(x, y, w, h float64, fill, outline string) {
	o := ""
	if outline != "" {
		o = fmt.Sprintf(` stroke="%s" stroke-width="1"`, outline)
	}
	fmt.Fprintf(&d.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"%s/>`+"\n", Num(x), Num(y), Num(max(w, 0)), Num(max(h, 0)), fill, o)
}

// TextStyle is how a text is set: size in pixels, anchor start, middle or
// end, and whether it is bold.
type TextStyle struct {
	Size   float64
	Anchor string
	Bold   bool
	Color  string
	Rotate bool // vertical, reading upwards
}

// Text sets s at x, y.
func (d *Doc) Text(x, y float64, st TextStyle, s string) {
	var esc bytes.Buffer
	xml.EscapeText(&esc, []byte(s))
	attrs := fmt.Sprintf(`x="%s" y="%s" font-size="%s"`, Num(x), Num(y), Num(st.Size))
	if st.Anchor != "" && st.Anchor != "start" {
		attrs += fmt.Sprintf(` text-anchor="%s"`, st.Anchor)
	}
	if st.Bold {
		attrs += ` font-weight="bold"`
	}
	if st.Color != "" {
		attrs += fmt.Sprintf(` fill="%s"`, st.Color)
	}
	if st.Rotate {
		attrs += fmt.Sprintf(` transform="rotate(-90 %s %s)"`, Num(x), Num(y))
	}
	fmt.Fprintf(&d.b, "<text %s>%s</text>\n", attrs, esc.String())
}

// Bytes closes the document and returns it.
func (d *Doc) Bytes() []byte {
	d.b.WriteString("</svg>\n")
	return d.b.Bytes()
}

// TextWidth estimates the width of s set at size: about 0.6 em a
// character in a sans-serif face, enough to keep texts apart.
func TextWidth(s string, size float64) float64 {
	return float64(len([]rune(s))) * size * 0.6
}

// Point is a point on the page, or of data.
type Point struct{ X, Y float64 }

// Box is a rectangle on the page: x, y its top left corner.
type Box struct{ X, Y, W, H float64 }

func (b Box) Right() float64  { return b.X + b.W }
func (b Box) Bottom() float64 { return b.Y + b.H }

// Overlaps reports whether b and o share any area.
func (b Box) Overlaps(o Box) bool {
	return b.X < o.Right() && o.X < b.Right() && b.Y < o.Bottom() && o.Y < b.Bottom()
}

// NiceTicks returns ticks from 0 (or lo) to at least hi, at a step of 1, 2
// or 5 times a power of ten, about n of them, and the number of decimals
// their labels need.
func NiceTicks(lo, hi float64, n int) (ticks []float64, decimals int) {
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

// TickLabel formats a tick with decimals decimals.
func TickLabel(v float64, decimals int) string {
	s := strconv.FormatFloat(v, 'f', decimals, 64)
	if s == "-0" {
		s = "0"
	}
	return s
}

// The look shared by the charts.
const (
	FontSize        = 12.0
	TitleSize       = 13.0
	CaptionSize     = 14.0
	LegendFontSize  = 11.5
	LegendLineLen   = 28.0
	LegendRowHeight = 18.0
	AxisColor       = "#444444"
	GridColor       = "#e3e3e3"
	RefColor        = "#8c8c8c"
)

// RefStroke is the look of a reference line (a limit such as B or the
// deadline): a wide, pale, dashed band drawn under the data, so that a
// series running along the limit shows on top of it and the band still
// shows around it.
var RefStroke = Stroke{Color: RefColor, Width: 6, Dash: "10 6", Opacity: 0.45}

// LegendEntry is one line of a legend: a sample of the line (or a filled
// square for bars) and its name.
type LegendEntry struct {
	Name string
	St   Stroke
	Fill string // bars: the square's colour
}

// LegendWidth is the width a legend of these entries takes.
func LegendWidth(entries []LegendEntry) float64 {
	w := 0.0
	for _, e := range entries {
		w = max(w, TextWidth(e.Name, LegendFontSize))
	}
	return LegendLineLen + 8 + w + 4
}

// DrawLegend draws entries top to bottom from the top left corner of at:
// beside the plot area, never over it.
func (d *Doc) DrawLegend(at Box, entries []LegendEntry) {
	d.Comment("legend")
	for i, e := range entries {
		y := at.Y + 10 + float64(i)*LegendRowHeight
		if e.Fill != "" {
			d.Rect(at.X+LegendLineLen/2-6, y-6, 12, 12, e.Fill, "")
		} else {
			d.Line(at.X, y, at.X+LegendLineLen, y, e.St)
		}
		d.Text(at.X+LegendLineLen+8, y+4, TextStyle{Size: LegendFontSize}, e.Name)
	}
}

// YAxis draws the frame, the grid and the y ticks of a plot area whose y
// scale runs from 0 to ymax (a tick value), with ylabel beside it.
func (d *Doc) YAxis(plot Box, ticks []float64, decimals int, ylabel string) {
	ymax := ticks[len(ticks)-1]
	for _, t := range ticks {
		y := plot.Bottom() - t/ymax*plot.H
		d.Line(plot.X, y, plot.Right(), y, Stroke{Color: GridColor, Width: 1})
		d.Text(plot.X-6, y+4, TextStyle{Size: FontSize, Anchor: "end", Color: AxisColor}, TickLabel(t, decimals))
	}
	d.Text(plot.X-44, plot.Y+plot.H/2, TextStyle{Size: FontSize, Anchor: "middle", Color: AxisColor, Rotate: true}, ylabel)
}

// Frame draws the plot area's border.
func (d *Doc) Frame(plot Box) {
	d.Rect(plot.X, plot.Y, plot.W, plot.H, "none", AxisColor)
}

// The layout of a panel.
const (
	CaptionLineH   = 20.0
	PanelTitleH    = 30.0 // a panel's title, above its plot area
	panelAxisLeft  = 64.0
	panelAxisBelow = 44.0
	panelGap       = 14.0
)

// Layout places a panel in outer: the plot area, and the legend to
// its right, outside it.
type Layout struct {
	Outer, Plot, Legend Box
}

// LayoutPanel lays a panel out in outer, with a legend legendW wide.
func LayoutPanel(outer Box, legendW float64) Layout {
	plot := Box{
		X: outer.X + panelAxisLeft,
		Y: outer.Y + PanelTitleH,
		W: outer.W - panelAxisLeft - panelGap - legendW - 2*panelGap,
		H: outer.H - PanelTitleH - panelAxisBelow,
	}
	legend := Box{X: plot.Right() + panelGap, Y: plot.Y, W: legendW, H: plot.H}
	return Layout{Outer: outer, Plot: plot, Legend: legend}
}
