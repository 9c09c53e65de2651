package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/svg"
)

// syntheticReport is a two-run report with a second without completions
// and one without server counts.
func syntheticReport() *loadReport {
	two, four := 2, 4
	gated := &runResult{Name: "gated", Setup: "B=2 Q=2 wait=5ms", DeadlineMs: 100, ElapsedS: 3.2,
		Policy: &cli.PolicyJSON{MaxConcurrent: 2, MaxQueue: 2, QueueWaitMs: 5},
		Seconds: []secondJSON{
			{T: 0, LengthS: 1, Completed: 90, WithinDeadline: 90, RejectedFull: 400, RejectedTimeout: 20, Running: 2, Waiting: 1.5,
				Latency: &cli.Pct{P50: 10, P95: 14, P99: 20}, ServerTx: &two, ServerConns: &four},
			{T: 1, LengthS: 1, RejectedFull: 500, RejectedDeadline: 30, Running: 2, Waiting: 2, ServerTx: &two, ServerConns: &four},
			{T: 2, LengthS: 1.2, Completed: 100, WithinDeadline: 99, Running: 1.8, Waiting: 1,
				Latency: &cli.Pct{P50: 11, P95: 15, P99: 110}},
		}}
	base := &runResult{Name: "baseline", Setup: "database/sql MaxOpenConns=2", DeadlineMs: 100, ElapsedS: 2, MaxOpenConns: 2,
		Seconds: []secondJSON{
			{T: 0, LengthS: 1, Completed: 80, Deadline: 30, Running: 2, Waiting: 20, Latency: &cli.Pct{P50: 60, P95: 95, P99: 99}},
			{T: 1, LengthS: 1, Completed: 70, Deadline: 40, Other: 1, Running: 2, Waiting: 22},
		}}
	return &loadReport{Runs: []*runResult{gated, base}}
}

// loadChartSize is the size of a load chart of runs runs, with or without
// its caption.
func loadChartSize(runs int, caption bool) (float64, float64) {
	top := 8.0
	if caption {
		top += svg.CaptionLineH
	}
	return loadColWidth * float64(runs), top + 4*loadPanelH + 8
}

func TestLoadChartIsAWellFormedSVG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.svg")
	if err := writeChart(path, syntheticReport()); err != nil {
		t.Fatal(err)
	}
	w, h := loadChartSize(2, false)
	s := clitest.WantSVGFile(t, path, w, h)
	for _, want := range []string{"gated (B=2 Q=2 wait=5ms): rejections per second", "baseline (database/sql MaxOpenConns=2): operations per second",
		"in flight (mean) and server transactions (most)", "latency of completed operations", ">admission full<", ">queue timeout<", ">would miss deadline<", ">B = 2<", ">MaxOpenConns = 2<", ">deadline 100 ms<"} {
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
	page := svg.Box{X: 0, Y: 0, W: c.w, H: c.h}
	for _, row := range c.cells {
		for _, cell := range row {
			lay := cell.lay
			entries := legendOf(cell.pn)
			// The legend's own extent: its rows and its widest name.
			used := svg.Box{X: lay.Legend.X, Y: lay.Legend.Y, W: svg.LegendWidth(entries), H: float64(len(entries)) * svg.LegendRowHeight}
			if used.Overlaps(lay.Plot) {
				t.Errorf("%s: legend %+v overlaps the plot area %+v", cell.title, used, lay.Plot)
			}
			if used.Right() > lay.Outer.Right() || used.Bottom() > lay.Plot.Bottom() || !used.Overlaps(page) {
				t.Errorf("%s: legend %+v leaves its panel %+v", cell.title, used, lay.Outer)
			}
			if lay.Plot.W < 400 || lay.Plot.H < 150 {
				t.Errorf("%s: plot area %+v too small", cell.title, lay.Plot)
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
				if prev != nil && l.st.Width >= prev.st.Width {
					t.Errorf("%s: %q (width %v) drawn over %q (width %v) is not narrower", title, l.name, l.st.Width, prev.name, prev.st.Width)
				}
				if colors[l.st.Color] || l.st.Color == svg.RefStroke.Color {
					t.Errorf("%s: %q has the colour %s of another line", title, l.name, l.st.Color)
				}
				colors[l.st.Color] = true
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
}
