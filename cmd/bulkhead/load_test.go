package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
)

// wantTotalsAddUp checks that every attempted operation is counted once,
// in the totals and second by second.
func wantTotalsAddUp(t *testing.T, r *runResult) {
	t.Helper()
	if err := r.checkTotals(); err != nil {
		t.Error(err)
	}
	if r.Attempted == 0 || r.Completed == 0 {
		t.Errorf("%s: attempted %d, completed %d: nothing ran", r.Name, r.Attempted, r.Completed)
	}
	if r.WithinDeadline > r.Completed {
		t.Errorf("%s: %d within deadline of %d completed", r.Name, r.WithinDeadline, r.Completed)
	}
	if r.OtherErrors != 0 {
		t.Errorf("%s: %d other errors: %v", r.Name, r.OtherErrors, r.ErrorSamples)
	}
}

func TestLoadOnSQLiteAttemptsExactlyTheCountAndAddsUp(t *testing.T) {
	dir := t.TempDir()
	jsonPath, chartPath := filepath.Join(dir, "load.json"), filepath.Join(dir, "load.svg")
	r := runOK(t, nil, "load", "--clients", "4", "--count", "60",
		"--max-concurrent", "2", "--max-queue", "1", "--queue-wait", "2ms", "--hold", "2ms",
		"--deadline", "10s", "--backoff", "1ms", "--baseline", "--max-open-conns", "2",
		"--progress", "0", "--json", jsonPath, "--chart", chartPath)
	rep := clitest.ReadJSON[loadReport](t, jsonPath)
	if len(rep.Runs) != 2 || rep.Runs[0].Name != "gated" || rep.Runs[1].Name != "baseline" {
		t.Fatalf("runs %+v, want gated and baseline", rep.Runs)
	}
	for _, run := range rep.Runs {
		wantTotalsAddUp(t, run)
		if run.Attempted != 60 {
			t.Errorf("%s: attempted %d, want exactly --count 60", run.Name, run.Attempted)
		}
		if run.Interrupted || run.InterruptedOps != 0 {
			t.Errorf("%s: interrupted without a signal", run.Name)
		}
	}
	gated, base := rep.Runs[0], rep.Runs[1]
	// The command's own counts agree with the gate's.
	// The gate keeps no more server connections than database/sql keeps
	// connections: at the end, at most its B+Q = 3 idle ones.
	if g := gated.Gate; g == nil || g.RejectedFull != gated.RejectedFull || g.RejectedTimeout != gated.RejectedTimeout || g.RejectedDeadline != gated.RejectedDeadline ||
		g.OpenConns < 1 || g.OpenConns > gated.PoolOpenConns || g.OpenConns > 3 || g.Dials < int64(g.OpenConns) || g.DialErrors != 0 || g.ConnectFailed != 0 {
		t.Errorf("gate stats %+v, command counted %d full and %d timeouts, database/sql has %d connections; want at most those and B+Q = 3 server connections",
			g, gated.RejectedFull, gated.RejectedTimeout, gated.PoolOpenConns)
	}
	if gated.Policy == nil || *gated.Policy != (cli.PolicyJSON{MaxConcurrent: 2, MaxQueue: 1, QueueWaitMs: 2}) {
		t.Errorf("policy %+v", gated.Policy)
	}
	if gated.QueueWaitP99Ms == nil {
		t.Error("no queue wait p99 from the gate's OnAdmit events")
	}
	if base.RejectedFull+base.RejectedTimeout != 0 || base.Gate != nil || base.MaxOpenConns != 2 {
		t.Errorf("baseline rejected %d, gate %+v, max open %d: it must run without the gate",
			base.RejectedFull+base.RejectedTimeout, base.Gate, base.MaxOpenConns)
	}
	clitest.WantText(t, r.Stdout, "gated", "baseline", "attempted", "goodput", "latency p99", "queue wait p99",
		fmt.Sprintf("gated: attempted 60 = completed %d", gated.Completed), "chart written to")
	if strings.Contains(r.Stdout, "server: most") {
		t.Error("server rows shown for SQLite")
	}
	w, h := loadChartSize(2, true)
	clitest.WantSVGFile(t, chartPath, w, h)
}

func TestLoadOnSQLiteDoesCPUWorkAndWritesJSONToStdout(t *testing.T) {
	r := runOK(t, nil, "load", "--work", "cpu", "--cpu-rows", "500", "--clients", "2", "--count", "6",
		"--max-concurrent", "1", "--max-queue", "1", "--queue-wait", "10s", "--deadline", "30s",
		"--progress", "0", "--json", "-")
	rep := clitest.JSON[loadReport](t, r.Stdout) // the JSON alone
	if len(rep.Runs) != 1 || rep.Runs[0].Work != "cpu" || rep.Runs[0].Attempted != 6 || !strings.Contains(r.Stderr, "CPU-bound query over 500 rows") {
		t.Fatalf("runs %+v", rep.Runs)
	}
	wantTotalsAddUp(t, rep.Runs[0])
	// With a queue as long as the clients and a long wait, nothing is rejected.
	if run := rep.Runs[0]; run.Completed != 6 {
		t.Errorf("completed %d of 6: %+v", run.Completed, run)
	}
	if !strings.Contains(r.Stderr, "attempted") {
		t.Errorf("the table goes to stderr with --json -: %q", r.Stderr)
	}
}

func TestLoadInterruptedStillReportsWhatWasMeasured(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	jsonPath := filepath.Join(t.TempDir(), "load.json")
	// The first progress line stands in for Ctrl-C in the middle of a run.
	r := program.CmdTerm(t, ctx, nil, &clitest.CancelOn{Cancel: cancel}, false, "load", "--clients", "4",
		"--duration", "10m", "--hold", "20ms", "--deadline", "10m", "--max-concurrent", "2",
		"--max-queue", "2", "--queue-wait", "10m", "--baseline", "--progress", "1ns", "--json", jsonPath)
	if r.Code != cli.ExitInterrupted {
		t.Fatalf("exit %d, stderr %q; want 130 after Ctrl-C", r.Code, r.Stderr)
	}
	rep := clitest.ReadJSON[loadReport](t, jsonPath)
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs; the baseline must not start after an interruption", len(rep.Runs))
	}
	run := rep.Runs[0]
	if !run.Interrupted {
		t.Error("run not marked interrupted")
	}
	if err := run.checkTotals(); err != nil {
		t.Error(err)
	}
	if run.Attempted == 0 {
		t.Error("nothing attempted")
	}
	if !strings.Contains(r.Stdout, "(interrupted)") || !strings.Contains(r.Stdout, "baseline: not run") {
		t.Errorf("table does not say it was interrupted:\n%s", r.Stdout)
	}
}

func TestLoadProgressRewritesOneLineOnATerminal(t *testing.T) {
	r := program.CmdTerm(t, context.Background(), nil, nil, true, "load", "--clients", "2", "--count", "10", "--hold", "1ms", "--deadline", "1m")
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.Stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(r.Stderr, "\rgated") || !strings.HasSuffix(r.Stderr, "\x1b[K\n") {
		t.Fatalf("want one line rewritten with \\r and ended once, got %q", r.Stderr)
	}
	for _, want := range []string{"completed 10", "rejected full 0", "timeout 0", "running 0", "waiting 0"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("final progress lacks %q: %q", want, r.Stderr)
		}
	}
}

func TestLoadProgressIsPlainLinesOffATerminal(t *testing.T) {
	r := runOK(t, nil, "load", "--clients", "2", "--count", "10", "--hold", "1ms", "--deadline", "1m", "--progress", "1ns")
	if strings.Contains(r.Stderr, "\r") || strings.Contains(r.Stderr, "\x1b") {
		t.Fatalf("terminal control sequences off a terminal: %q", r.Stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.Stderr, "\n"), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, "gated ") {
			t.Errorf("unexpected line %q", l)
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, "completed 10") {
		t.Errorf("last progress line %q does not show the final count", last)
	}
}

func TestLoadOnPostgreSQLKeepsServerTransactionsWithinB(t *testing.T) {
	dir := t.TempDir()
	jsonPath, chartPath := filepath.Join(dir, "load.json"), filepath.Join(dir, "load.svg")
	// A deadline far beyond any operation: no statement is cancelled, so
	// the server sees exactly what the gate lets through.
	r := runOK(t, nil, "load", "--dsn", clitest.PostgresURL(t), "--clients", "8", "--duration", "1s",
		"--max-concurrent", "2", "--max-queue", "2", "--queue-wait", "5ms", "--hold", "10ms",
		"--deadline", "30s", "--baseline", "--max-open-conns", "2", "--progress", "0",
		"--json", jsonPath, "--chart", chartPath)
	rep := clitest.ReadJSON[loadReport](t, jsonPath)
	if len(rep.Runs) != 2 {
		t.Fatalf("%d runs, want gated and baseline", len(rep.Runs))
	}
	for _, run := range rep.Runs {
		wantTotalsAddUp(t, run)
		clitest.WantServerTx(t, run.Name, run.ServerMaxTransactions, run.ServerMaxConnections, run.ServerMonitorError, 2)
	}
	// What bulkhead budget counts for B = 2: the operations running and
	// the free server connections kept for them, B. For a moment there
	// can be one more (a dial after 2 ms without a give-back, closed once
	// free), and the server lists a closed one until its backend exits.
	gated := rep.Runs[0]
	if g := gated.Gate; *gated.ServerMaxConnections > 2*2 || g.OpenConns > 2+1 || g.OpenConns > gated.PoolOpenConns || g.DialErrors != 0 {
		t.Errorf("gated: %d server connections at most, %d open at the end (database/sql: %d), %d dials (%d failed); want about B = 2, no failure",
			*gated.ServerMaxConnections, g.OpenConns, gated.PoolOpenConns, g.Dials, g.DialErrors)
	}
	if gated.Gate.RejectedFull != gated.RejectedFull || gated.Gate.RejectedTimeout != gated.RejectedTimeout || gated.Gate.RejectedDeadline != gated.RejectedDeadline {
		t.Errorf("gate stats %+v, command counted %d full, %d timeouts and %d that would miss their deadline",
			gated.Gate, gated.RejectedFull, gated.RejectedTimeout, gated.RejectedDeadline)
	}
	if !strings.Contains(r.Stdout, "server: most transactions") {
		t.Errorf("table lacks the server rows:\n%s", r.Stdout)
	}
	w, h := loadChartSize(2, true)
	clitest.WantSVGFile(t, chartPath, w, h)
}

func TestLoadOnMariaDBAddsUp(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "load.json")
	runOK(t, nil, "load", "--dsn", clitest.MySQLURL(t), "--clients", "4", "--count", "20",
		"--max-concurrent", "2", "--max-queue", "2", "--queue-wait", "10s", "--hold", "5ms",
		"--deadline", "30s", "--progress", "0", "--json", jsonPath)
	run := clitest.ReadJSON[loadReport](t, jsonPath).Runs[0]
	wantTotalsAddUp(t, run)
	if run.Attempted != 20 || run.Completed != 20 {
		t.Errorf("attempted %d, completed %d; want 20 and 20 (the queue holds every client)", run.Attempted, run.Completed)
	}
}

func TestLoadRejectsBadInput(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing", "load.svg")
	wantBadInput(t, "load", []badInput{
		{"clients zero", nil, []string{"--clients", "0"}, []string{"--clients is 0"}},
		{"clients not a number", nil, []string{"--clients", "many"}, []string{`"many"`, "-clients"}},
		{"negative count", nil, []string{"--count", "-5"}, []string{"--count is -5"}},
		{"zero duration", nil, []string{"--duration", "0s"}, []string{"--duration is 0s"}},
		{"duration without unit", nil, []string{"--duration", "10"}, []string{`"10"`, "-duration"}},
		{"unknown work", nil, []string{"--work", "disk"}, []string{`--work is "disk"`, "hold or cpu"}},
		{"zero cpu rows", nil, []string{"--cpu-rows", "0"}, []string{"--cpu-rows is 0"}},
		{"negative hold", nil, []string{"--hold", "-1s"}, []string{"--hold is -1s"}},
		{"zero deadline", nil, []string{"--deadline", "0s"}, []string{"--deadline is 0s"}},
		{"zero B", nil, []string{"--max-concurrent", "0"}, []string{"--max-concurrent is 0"}},
		{"negative Q", nil, []string{"--max-queue", "-1"}, []string{"--max-queue is -1"}},
		{"long queue wait", nil, []string{"--queue-wait", "2h"}, []string{"--queue-wait is 2h0m0s"}},
		{"negative pool", nil, []string{"--max-open-conns", "-1"}, []string{"--max-open-conns is -1"}},
		{"chart format", nil, []string{"--chart", "load.jpg"}, []string{`--chart "load.jpg"`, `".jpg"`, "want a file name ending in .svg"}},
		{"chart png", nil, []string{"--chart", "load.png"}, []string{`--chart "load.png"`, "PNG is not supported", "want a file name ending in .svg"}},
		{"chart directory", nil, []string{"--chart", missing}, []string{"--chart", "does not exist"}},
		{"json directory", nil, []string{"--json", missing}, []string{"--json", "does not exist"}},
		{"bad env B", map[string]string{cli.EnvMaxConcurrent: "four"}, nil, []string{cli.EnvMaxConcurrent, `"four"`}},
		{"bad env wait", map[string]string{cli.EnvQueueWait: "20"}, nil, []string{cli.EnvQueueWait, `"20"`}},
		{"bad dsn", nil, []string{"--dsn", "sqlserver://h/db"}, []string{"--dsn", "sqlserver://h/db", "postgres://"}},
		{"unreachable", nil, []string{"--dsn", "postgres://postgres@127.0.0.1:1/test?sslmode=disable", "--progress", "0"},
			[]string{"cannot connect", "postgres://postgres@127.0.0.1:1/test"}},
	})
}

func TestLoadFlagsOverrideABadEnvironmentEntirely(t *testing.T) {
	vars := map[string]string{cli.EnvMaxConcurrent: "four"}
	runOK(t, vars, "load", "--count", "2", "--clients", "1", "--hold", "0s", "--progress", "0",
		"--max-concurrent", "1", "--max-queue", "0", "--queue-wait", "0s")
}

func TestLoadTakesThePolicyFromTheEnvironment(t *testing.T) {
	vars := map[string]string{cli.EnvMaxConcurrent: "3", cli.EnvMaxQueue: "5", cli.EnvQueueWait: "7ms"}
	r := runOK(t, vars, "load", "--count", "2", "--clients", "1", "--hold", "0s", "--progress", "0",
		"--max-queue", "1")
	if !strings.Contains(r.Stdout, "B=3 Q=1 wait=7ms") {
		t.Fatalf("want B and the wait from the environment, Q from the flag:\n%s", r.Stdout)
	}
}

func TestTotalsCheckCatchesAMiscount(t *testing.T) {
	ok := &runResult{Name: "x", Attempted: 7, Completed: 1, RejectedFull: 1, RejectedTimeout: 1, RejectedDeadline: 1, DeadlineExceeded: 1,
		InterruptedOps: 1, OtherErrors: 1, Seconds: []secondJSON{
			{Completed: 1, RejectedFull: 1, RejectedTimeout: 1, RejectedDeadline: 1},
			{Deadline: 1, Interrupted: 1, Other: 1},
		}}
	if err := ok.checkTotals(); err != nil {
		t.Fatal(err)
	}
	lost := *ok
	lost.Attempted = 8
	if lost.checkTotals() == nil {
		t.Error("an operation counted as attempted but in no outcome passed")
	}
	unbucketed := *ok
	unbucketed.Seconds = ok.Seconds[:1]
	if unbucketed.checkTotals() == nil {
		t.Error("outcomes missing from the per-second counts passed")
	}
}

func TestLastShortSecondIsMergedIntoThePreviousOne(t *testing.T) {
	r := newRecorder(time.Second)
	start := time.Unix(1000, 0)
	r.begin(start)
	r.mu.Lock()
	r.bucketLocked(start).n[cli.OutCompleted] = 2
	r.bucketLocked(start.Add(1500 * time.Millisecond)).n[cli.OutCompleted] = 3
	r.bucketLocked(start.Add(2100 * time.Millisecond)).n[cli.OutRejectedFull] = 1
	r.mu.Unlock()
	secs, lengths := r.buckets(2200 * time.Millisecond)
	if len(secs) != 2 || lengths[0] != 1 || lengths[1] < 1.19 || lengths[1] > 1.21 {
		t.Fatalf("%d buckets, lengths %v; want 2, [1 1.2]", len(secs), lengths)
	}
	if secs[1].n[cli.OutCompleted] != 3 || secs[1].n[cli.OutRejectedFull] != 1 {
		t.Fatalf("merged bucket %+v", secs[1].n)
	}
	if r.secs[1].n[cli.OutRejectedFull] != 0 {
		t.Fatal("merging changed the recorder's own buckets")
	}
	secs, lengths = r.buckets(2700 * time.Millisecond)
	if len(secs) != 3 || lengths[2] < 0.69 || lengths[2] > 0.71 {
		t.Fatalf("%d buckets, lengths %v; a last bucket of 0.7 s stays", len(secs), lengths)
	}
}
