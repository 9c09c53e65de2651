package main

import (
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
			{T: 1, LengthS: 1, RejectedFull: 500, Running: 2, Waiting: 2},
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

func TestChartIsAValidPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.png")
	if err := writeChart(path, syntheticReport()); err != nil {
		t.Fatal(err)
	}
	wantPNG(t, path, 2)
}

func TestChartAtFullSizeIsAValidPNG(t *testing.T) {
	defer func(dpi int) { chartDPI = dpi }(chartDPI)
	chartDPI = 96
	path := filepath.Join(t.TempDir(), "chart.png")
	rep := syntheticReport()
	rep.Runs = rep.Runs[:1]
	if err := writeChart(path, rep); err != nil {
		t.Fatal(err)
	}
	wantPNG(t, path, 1) // 864x1152
}

func TestChartCanBeSVG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.svg")
	rep := syntheticReport()
	rep.Runs = rep.Runs[:1]
	if err := writeChart(path, rep); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, "<svg") || !strings.Contains(s, "</svg>") || !strings.Contains(s, "rejections per second") {
		t.Fatalf("not an SVG chart: %.200s", s)
	}
}

func TestChartOfNothingIsAnError(t *testing.T) {
	if err := writeChart(filepath.Join(t.TempDir(), "c.png"), &loadReport{}); err == nil {
		t.Fatal("a chart without runs was written")
	}
}
