package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// syntheticReport is a two-run report with a second without completions
// and one without server counts.
func syntheticReport() *loadReport {
	two, four := 2, 4
	gated := &runResult{Name: "gated", Setup: "B=2 Q=2 wait=5ms", DeadlineMs: 100, ElapsedS: 3.2,
		Policy: &policyJSON{MaxConcurrent: 2, MaxQueue: 2, QueueWaitMs: 5},
		Seconds: []secondJSON{
			{T: 0, LengthS: 1, Completed: 90, WithinDeadline: 90, RejectedFull: 400, RejectedTimeout: 20, Running: 2, Waiting: 1.5,
				Latency: &pct{P50: 10, P95: 14, P99: 20}, ServerTx: &two, ServerConns: &four},
			{T: 1, LengthS: 1, RejectedFull: 500, Running: 2, Waiting: 2, ServerTx: &two, ServerConns: &four},
			{T: 2, LengthS: 1.2, Completed: 100, WithinDeadline: 99, Running: 1.8, Waiting: 1,
				Latency: &pct{P50: 11, P95: 15, P99: 110}},
		}}
	base := &runResult{Name: "baseline", Setup: "database/sql MaxOpenConns=2", DeadlineMs: 100, ElapsedS: 2, MaxOpenConns: 2,
		Seconds: []secondJSON{
			{T: 0, LengthS: 1, Completed: 80, Deadline: 30, Running: 2, Waiting: 20, Latency: &pct{P50: 60, P95: 95, P99: 99}},
			{T: 1, LengthS: 1, Completed: 70, Deadline: 40, Other: 1, Running: 2, Waiting: 22},
		}}
	return &loadReport{Runs: []*runResult{gated, base}}
}

// wantSVG checks that b is a well-formed SVG document of the given size
// and returns it as a string.
func wantSVG(t *testing.T, b []byte, w, h float64) string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
			attr := map[string]string{}
			for _, a := range se.Attr {
				attr[a.Name.Local] = a.Value
			}
			if attr["width"] != num(w) || attr["height"] != num(h) {
				t.Errorf("size %sx%s, want %sx%s", attr["width"], attr["height"], num(w), num(h))
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return string(b)
}

// wantSVGFile reads path and checks it with wantSVG.
func wantSVGFile(t *testing.T, path string, w, h float64) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return wantSVG(t, b, w, h)
}

// loadChartSize is the size of a load chart of runs runs, with or without
// its caption.
func loadChartSize(runs int, caption bool) (float64, float64) {
	top := 8.0
	if caption {
		top += captionLineH
	}
	return loadColWidth * float64(runs), top + 4*loadPanelH + 8
}

func TestLoadChartIsAWellFormedSVG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.svg")
	if err := writeChart(path, syntheticReport()); err != nil {
		t.Fatal(err)
	}
	w, h := loadChartSize(2, false)
	s := wantSVGFile(t, path, w, h)
	for _, want := range []string{"gated (B=2 Q=2 wait=5ms): rejections per second", "baseline (database/sql MaxOpenConns=2): operations per second",
		"in flight (mean) and server transactions (most)", "latency of completed operations", ">admission full<", ">B = 2<", ">MaxOpenConns = 2<", ">deadline 100 ms<"} {
		if !strings.Contains(s, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
}

func TestLoadChartLegendsStandBesideThePlotAreas(t *testing.T) {
	c, err := layoutLoadChart(syntheticReport())
	if err != nil {
		t.Fatal(err)
	}
	page := box{0, 0, c.w, c.h}
	for _, row := range c.cells {
		for _, cell := range row {
			lay := cell.lay
			entries := legendOf(cell.pn)
			// The legend's own extent: its rows and its widest name.
			used := box{lay.legend.x, lay.legend.y, legendWidth(entries), float64(len(entries)) * legendRowHeight}
			if used.overlaps(lay.plot) {
				t.Errorf("%s: legend %+v overlaps the plot area %+v", cell.title, used, lay.plot)
			}
			if used.right() > lay.outer.right() || used.bottom() > lay.plot.bottom() || !used.overlaps(page) {
				t.Errorf("%s: legend %+v leaves its panel %+v", cell.title, used, lay.outer)
			}
			if lay.plot.w < 400 || lay.plot.h < 150 {
				t.Errorf("%s: plot area %+v too small", cell.title, lay.plot)
			}
		}
	}
}

func TestLoadChartDrawsEverySeriesVisibly(t *testing.T) {
	rep := syntheticReport()
	b, err := loadChartSVG(rep)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, r := range rep.Runs {
		for _, pn := range chartPanels(r) {
			title := r.Name + " (" + r.Setup + "): " + pn.title
			start := strings.Index(s, "<!-- panel: "+title+" -->")
			if start < 0 {
				t.Fatalf("panel %q not drawn", title)
			}
			end := strings.Index(s[start+1:], "<!-- panel: ")
			section := s[start:]
			if end >= 0 {
				section = s[start : start+1+end]
			}
			lastRef, firstData := -1, len(section)
			var prev *series
			colors := map[string]bool{}
			for i := range pn.lines {
				l := &pn.lines[i]
				if l.ref {
					at := strings.Index(section, "<!-- reference: "+l.name+" -->")
					if at < 0 {
						t.Errorf("%s: reference %q not drawn", title, l.name)
					}
					lastRef = max(lastRef, at)
					continue
				}
				at := strings.Index(section, "<!-- series: "+l.name+" -->")
				if at < 0 {
					t.Errorf("%s: series %q not drawn", title, l.name)
				}
				firstData = min(firstData, at)
				// Each line narrower than the one drawn before it: where
				// two coincide, the one below shows on both sides.
				if prev != nil && l.st.width >= prev.st.width {
					t.Errorf("%s: %q (width %v) drawn over %q (width %v) is not narrower", title, l.name, l.st.width, prev.name, prev.st.width)
				}
				if colors[l.st.color] || l.st.color == refStroke.color {
					t.Errorf("%s: %q has the colour %s of another line", title, l.name, l.st.color)
				}
				colors[l.st.color] = true
				prev = l
			}
			if lastRef > firstData {
				t.Errorf("%s: a reference line is drawn over the data", title)
			}
		}
	}
	// The running line of the gated run runs along B: the reference is
	// drawn first, under it.
	conc := chartPanels(rep.Runs[0])[2]
	if !conc.lines[0].ref || conc.lines[0].name != "B = 2" || conc.lines[1].name != "running" {
		t.Fatalf("in-flight panel lines %+v", conc.lines)
	}
}

func TestChartOfNothingIsAnError(t *testing.T) {
	if err := writeChart(filepath.Join(t.TempDir(), "c.svg"), &loadReport{}); err == nil {
		t.Fatal("a chart without runs was written")
	}
	if err := writeOverloadChart(filepath.Join(t.TempDir(), "c.svg"), []*overloadReport{{}}); err == nil {
		t.Fatal("an overload chart without phases was written")
	}
}

func TestNiceTicksCoverTheDataWithRoundSteps(t *testing.T) {
	for _, c := range []struct {
		hi   float64
		want []float64
		dec  int
	}{
		{104, []float64{0, 50, 100, 150}, 0},
		{1, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}, 1},
		{520, []float64{0, 200, 400, 600}, 0},
		{0, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}, 1},
	} {
		got, dec := niceTicks(0, c.hi, 5)
		if len(got) != len(c.want) || dec != c.dec {
			t.Errorf("niceTicks(0, %v) = %v (%d decimals), want %v (%d)", c.hi, got, dec, c.want, c.dec)
			continue
		}
		for i := range got {
			if tickLabel(got[i], dec) != tickLabel(c.want[i], c.dec) {
				t.Errorf("niceTicks(0, %v) = %v, want %v", c.hi, got, c.want)
				break
			}
		}
	}
}

func TestSVGTextIsEscaped(t *testing.T) {
	d := newSVG(10, 10)
	d.text(1, 1, textStyle{size: 10}, `a<b & "c"`)
	d.comment("x -- y")
	s := wantSVG(t, d.bytes(), 10, 10)
	if !strings.Contains(s, "a&lt;b &amp; &#34;c&#34;") {
		t.Fatalf("text not escaped: %s", s)
	}
}
