package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/svg"
)

// Colours of the configurations.
var configColors = map[string]string{
	cfgPlain:          "#d62728",
	cfgSemaphore:      "#ff7f0e",
	cfgWaitFirst:      "#1f77b4",
	cfgGate:           "#1b9e3e",
	cfgFsBulkhead:     "#9467bd",
	cfgFsAdaptive:     "#8c564b",
	cfgFsAdaptiveWait: "#e377c2",
	cfgAdaptive:       "#17becf",
	cfgAlone:          "#7f7f7f",
}

// staticColors are the static configurations' colours, light to dark
// green in the order of the sweep.
var staticColors = []string{"#c7e9c0", "#a1d99b", "#74c476", "#41ab5d", "#238b45", "#006d2c", "#00441b", "#002910"}

// color returns the colour of one of rep's configurations.
func (rep *overloadReport) color(config string) string {
	if b, ok := staticB(config); ok {
		if i := slices.Index(rep.Sweep, b); i >= 0 {
			return staticColors[i%len(staticColors)]
		}
		return staticColors[0]
	}
	return configColors[config]
}

// overloadRefStroke is the look of a reference line over bars: thin and
// dark, drawn on top, since a bar (an area) would hide a line under it;
// a thin line over a bar leaves the bar visible.
var overloadRefStroke = svg.Stroke{Color: "#555555", Width: 1.5, Dash: "6 4"}

// overloadPanel is one panel of the chart: a value of each phase, drawn
// as bars grouped by load, and reference lines.
type overloadPanel struct {
	title, ylabel string
	value         func(*overloadPhase) (float64, bool)
	format        string // of the value labels
	refs          []refLine
}

// Size of the overload chart: two rows of two panels.
const (
	overloadW      = 1344.0
	overloadPanelH = 440.0
)

// writeOverloadChart draws reps into path as SVG. Each report is four
// panels of bars grouped by offered load, one bar per configuration:
// goodput, p99 latency of successes, p99 time for a failure to come back,
// and the most transactions the server showed. Each legend stands beside
// its plot area. Several reports (--service) stand one above the other.
func writeOverloadChart(path string, reps []*overloadReport) error {
	var parts [][]byte
	for _, rep := range reps {
		if len(rep.Phases) == 0 {
			continue
		}
		b, err := overloadChartSVG(rep)
		if err != nil {
			return err
		}
		parts = append(parts, b)
		if rep.Shift > 0 {
			parts = append(parts, shiftChartSVG(rep))
		}
	}
	if len(parts) == 0 {
		return fmt.Errorf("nothing measured")
	}
	if len(parts) == 1 {
		return os.WriteFile(path, parts[0], 0o644)
	}
	return os.WriteFile(path, stacked(parts), 0o644)
}

// stacked puts SVG documents (svg.Page's) one above the other in one
// document, each as a nested svg element.
func stacked(parts [][]byte) []byte {
	var w, h float64
	var inner []string
	for _, p := range parts {
		doc := string(p)
		if i := strings.Index(doc, "?>"); strings.HasPrefix(doc, "<?xml") && i >= 0 {
			doc = strings.TrimLeft(doc[i+2:], "\n")
		}
		var pw, ph float64
		fmt.Sscanf(attr(doc, "width"), "%g", &pw)
		fmt.Sscanf(attr(doc, "height"), "%g", &ph)
		// The nested document keeps its own coordinates, placed at y.
		inner = append(inner, strings.Replace(doc, "<svg ", fmt.Sprintf("<svg x=\"0\" y=\"%g\" ", h), 1))
		w = max(w, pw)
		h += ph
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" viewBox=\"0 0 %g %g\">\n", w, h, w, h)
	for _, d := range inner {
		b.WriteString(d)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// attr returns the value of the first name="..." attribute in doc.
func attr(doc, name string) string {
	i := strings.Index(doc, " "+name+"=\"")
	if i < 0 {
		return ""
	}
	v := doc[i+len(name)+3:]
	if j := strings.IndexByte(v, '"'); j >= 0 {
		return v[:j]
	}
	return ""
}

func overloadPanels(rep *overloadReport) []overloadPanel {
	p99 := func(f func(*overloadPhase) *cli.Pct) func(*overloadPhase) (float64, bool) {
		return func(ph *overloadPhase) (float64, bool) {
			if v := f(ph); v != nil {
				return v.P99, true
			}
			return 0, false
		}
	}
	deadline := refLine{name: fmt.Sprintf("deadline %.0f ms", rep.DeadlineMs), y: rep.DeadlineMs, st: overloadRefStroke}
	return []overloadPanel{
		{
			title: "goodput: committed within the deadline", ylabel: "transactions/s", format: "%.0f",
			value: func(ph *overloadPhase) (float64, bool) { return ph.GoodputPerS, true },
			refs:  []refLine{{name: fmt.Sprintf("capacity C = %.0f/s", rep.Capacity), y: rep.Capacity, st: overloadRefStroke}},
		},
		{
			title: "p99 latency of successes", ylabel: "ms", format: "%.0f",
			value: p99(func(ph *overloadPhase) *cli.Pct { return ph.SuccessMs }),
			refs:  []refLine{deadline},
		},
		{
			title: "p99 time for a failure to come back", ylabel: "ms", format: "%.1f",
			value: p99(func(ph *overloadPhase) *cli.Pct { return ph.FailureMs }),
			refs:  []refLine{deadline},
		},
		{
			title: "most transactions open on the server", ylabel: "transactions", format: "%.0f",
			value: func(ph *overloadPhase) (float64, bool) {
				if ph.ServerMaxTx == nil {
					return 0, false
				}
				return float64(*ph.ServerMaxTx), true
			},
			refs: []refLine{{name: fmt.Sprintf("B = %d", rep.Policy.MaxConcurrent), y: float64(rep.Policy.MaxConcurrent), st: overloadRefStroke}},
		},
	}
}

func overloadChartSVG(rep *overloadReport) ([]byte, error) {
	if len(rep.Phases) == 0 {
		return nil, fmt.Errorf("nothing measured")
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
	names, keys := make([]string, len(loads)), make([]string, len(loads))
	for i, l := range loads {
		names[i] = fmt.Sprintf("%s×C (%.0f/s)", fmtLoad(l), l*rep.Capacity)
		keys[i] = fmtLoad(l) + "×C"
	}
	colors := make([]string, len(configs))
	for i, c := range configs {
		colors[i] = rep.color(c)
	}
	panels := overloadPanels(rep)
	legends := make([][]svg.LegendEntry, len(panels))
	legendW := 0.0
	for i, pn := range panels {
		for _, c := range configs {
			legends[i] = append(legends[i], svg.LegendEntry{Name: c, Fill: rep.color(c)})
		}
		for _, r := range pn.refs {
			legends[i] = append(legends[i], svg.LegendEntry{Name: r.name, St: r.st})
		}
		legendW = max(legendW, svg.LegendWidth(legends[i]))
	}

	captions := []string{rep.caption(0), rep.caption(1)}
	top := svg.CaptionsH(len(captions))
	const cols = 2
	rows := (len(panels) + cols - 1) / cols
	w, h := overloadW, top+float64(rows)*overloadPanelH+8
	d := svg.Page(w, h, captions)
	for i, pn := range panels {
		outer := svg.Box{X: float64(i%cols) * w / cols, Y: top + float64(i/cols)*overloadPanelH, W: w / cols, H: overloadPanelH}
		lay := svg.LayoutPanel(outer, legendW)
		drawBars(d, barPanel{
			title: pn.title, ylabel: pn.ylabel, format: pn.format,
			groups: names, keys: keys, series: configs, colors: colors, refs: pn.refs,
			value: func(g, s int) (float64, bool) {
				if ph := rep.phase(loads[g], configs[s]); ph != nil {
					return pn.value(ph)
				}
				return 0, false
			},
		}, lay, legends[i])
	}
	return d.Bytes(), nil
}

// caption returns the chart's caption, line i of two.
func (rep *overloadReport) caption(i int) string {
	if i == 0 {
		db := rep.Database
		if f := strings.Fields(rep.ServerVersion); len(f) > 0 {
			db = "PostgreSQL " + f[0] // without the packager's suffix
		}
		target := ""
		if rep.ServiceTargetMs > 0 {
			target = fmt.Sprintf("S ≈ %.0f ms: ", rep.ServiceTargetMs)
		}
		return fmt.Sprintf("%sopen-loop overload on %s, %d CPUs shared by client and server; %s, deadline %.0f ms",
			target, db, rep.CPUs, rep.Work, rep.DeadlineMs)
	}
	s := ""
	if rep.ServiceMs != nil {
		s = fmt.Sprintf("S p50 %.1f ms, ", rep.ServiceMs.P50)
	}
	return fmt.Sprintf("%sC %.0f/s; plain: unlimited pool; semaphore: MaxOpenConns %d; waitfirst: B=%d, wait %.0f ms first; gate: B=%d Q=%d wait %.0f ms",
		s, rep.Capacity, rep.Policy.MaxConcurrent, rep.Policy.MaxConcurrent, rep.Policy.QueueWaitMs, rep.Policy.MaxConcurrent, rep.Policy.MaxQueue, rep.Policy.QueueWaitMs)
}
