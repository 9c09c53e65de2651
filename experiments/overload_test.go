package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/svg"
)

// countedArrivals is how many of the arrivals of a load fall after the
// warm-up: what each configuration must account for.
func countedArrivals(rate float64, warmup, duration time.Duration, seed uint64) int64 {
	var n int64
	for _, at := range arrivals(rate, warmup+duration, seed) {
		if at >= warmup {
			n++
		}
	}
	return n
}

// wantPhaseAddsUp checks that a phase accounts for every counted arrival
// exactly once and that its figures are consistent.
func wantPhaseAddsUp(t *testing.T, ph *overloadPhase, arrived int64) {
	t.Helper()
	if ph.Arrived != arrived {
		t.Errorf("%v×C %s: %d arrivals counted, want the %d drawn after the warm-up", ph.Load, ph.Config, ph.Arrived, arrived)
	}
	if ph.Committed+ph.failed() != ph.Arrived {
		t.Errorf("%v×C %s: committed %d + failed %d != arrived %d", ph.Load, ph.Config, ph.Committed, ph.failed(), ph.Arrived)
	}
	if ph.WithinDeadline > ph.Committed {
		t.Errorf("%v×C %s: %d within the deadline of %d committed", ph.Load, ph.Config, ph.WithinDeadline, ph.Committed)
	}
	if ph.OtherErrors != 0 || ph.InterruptedOps != 0 {
		t.Errorf("%v×C %s: %d other errors (%v), %d interrupted", ph.Load, ph.Config, ph.OtherErrors, ph.ErrorSamples, ph.InterruptedOps)
	}
	if ph.Committed > 0 && ph.SuccessMs == nil {
		t.Errorf("%v×C %s: commits without latencies", ph.Load, ph.Config)
	}
}

func TestOverloadOnSQLiteOffersTheSameArrivalsToEveryConfiguration(t *testing.T) {
	dir := t.TempDir()
	jsonPath, chartPath := filepath.Join(dir, "overload.json"), filepath.Join(dir, "overload.svg")
	r := runCmd(t, nil, "overload", "--capacity", "100", "--loads", "1,2", "--duration", "300ms",
		"--warmup", "100ms", "--capacity-duration", "150ms", "--cpu-rows", "200", "--max-concurrent", "2",
		"--deadline", "10s", "--seed", "7", "--json", jsonPath, "--chart", chartPath)
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	rep := clitest.ReadJSON[overloadReport](t, jsonPath)
	if rep.Capacity != 100 || rep.CapacityMeasured || rep.ServiceMs == nil {
		t.Errorf("capacity %v (measured %v), service %+v: want 100 given and S measured", rep.Capacity, rep.CapacityMeasured, rep.ServiceMs)
	}
	// By the rule: s = B/C = 20ms, wait = 10s − 2s = 9960ms, Q = max(B, ⌊100·wait⌋).
	if !rep.Rule || rep.Policy != (cli.PolicyJSON{MaxConcurrent: 2, MaxQueue: 996, QueueWaitMs: 9960}) {
		t.Errorf("policy %+v (by rule %v), want B=2 Q=996 wait=9960ms by the rule", rep.Policy, rep.Rule)
	}
	var got []string
	for _, ph := range rep.Phases {
		got = append(got, fmtLoad(ph.Load)+" "+ph.Config)
	}
	want := []string{"1 plain", "1 semaphore", "1 waitfirst", "1 gate", "2 plain", "2 semaphore", "2 waitfirst", "2 gate"}
	if !slices.Equal(got, want) {
		t.Fatalf("phases %v, want %v", got, want)
	}
	for i, ph := range rep.Phases {
		load := float64(1 + i/4)
		wantPhaseAddsUp(t, ph, countedArrivals(load*100, 100*time.Millisecond, 300*time.Millisecond, 7+uint64(i/4)))
		// A deadline of seconds and a queue as long: nothing fails.
		if ph.Committed != ph.Arrived || ph.WithinDeadline != ph.Committed {
			t.Errorf("%v×C %s: %d of %d committed, %d in time", ph.Load, ph.Config, ph.Committed, ph.Arrived, ph.WithinDeadline)
		}
		if ph.ServerMaxTx != nil {
			t.Errorf("%v×C %s: server counts on SQLite", ph.Load, ph.Config)
		}
	}
	clitest.WantText(t, r.Stdout, "overload on embedded SQLite", "2 CPUs", "gate B=2 Q=996", "by the rule",
		"1×C: gate goodput = ", "2×C: gate goodput = ", "chart written to")
	svg := clitest.WantSVGFile(t, chartPath, overloadW, 8+2*svg.CaptionLineH+2*overloadPanelH+8)
	for _, want := range []string{"goodput: committed within the deadline", "p99 latency of successes",
		"<!-- bar: 2×C gate -->", ">capacity C = 100/s<", ">semaphore<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
}

func TestOverloadGivenPolicyAndConfigurationsAreUsedAsGiven(t *testing.T) {
	r := runCmd(t, nil, "overload", "--capacity", "50", "--loads", "3", "--duration", "200ms",
		"--warmup", "0s", "--capacity-duration", "150ms", "--cpu-rows", "100", "--max-concurrent", "1",
		"--max-queue", "0", "--queue-wait", "0s", "--deadline", "10s", "--configs", "gate,semaphore", "--json", "-")
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	rep := clitest.JSON[overloadReport](t, r.Stdout) // the JSON alone
	if rep.Rule || rep.Policy != (cli.PolicyJSON{MaxConcurrent: 1}) {
		t.Errorf("policy %+v (by rule %v), want B=1 Q=0 wait=0 as given", rep.Policy, rep.Rule)
	}
	if len(rep.Phases) != 2 || rep.Phases[0].Config != cfgSemaphore || rep.Phases[1].Config != cfgGate {
		t.Fatalf("phases %+v, want semaphore then gate", rep.Phases)
	}
	arrived := countedArrivals(150, 0, 200*time.Millisecond, 1)
	for _, ph := range rep.Phases {
		wantPhaseAddsUp(t, ph, arrived)
	}
	// The semaphore makes every request wait its turn; the gate with B=1
	// and no queue rejects what finds the permit taken. Which ones it
	// rejects depends on timing; that it rejects at once does not.
	if sem := rep.Phases[0]; sem.RejectedFull+sem.RejectedTimeout != 0 {
		t.Errorf("semaphore rejected %d", sem.RejectedFull+sem.RejectedTimeout)
	}
	if g := rep.Phases[1]; g.RejectedTimeout != 0 {
		t.Errorf("gate with Q=0: %d queue timeouts, want rejections at admission only", g.RejectedTimeout)
	}
	if !strings.Contains(r.Stderr, "gate goodput = ") {
		t.Errorf("the table goes to stderr with --json -: %q", r.Stderr)
	}
}

func TestQueueRuleLeavesTheWorkTimeToFinishWithinTheDeadline(t *testing.T) {
	for _, c := range []struct {
		deadline time.Duration
		b        int
		capacity float64
		wait     time.Duration
		q        int
	}{
		// s = B/C = 15.3ms: wait = 100ms − 2s, Q = max(B, ⌊C·wait⌋).
		{100 * time.Millisecond, 2, 131, 69 * time.Millisecond, 9},
		{100 * time.Millisecond, 2, 400, 90 * time.Millisecond, 36},
		{time.Second, 10, 1000, 980 * time.Millisecond, 980},
		// s = 40ms: ⌊C·wait⌋ = 1, fewer than B.
		{100 * time.Millisecond, 2, 50, 20 * time.Millisecond, 2},
		// Work longer than half the deadline: no queue at all.
		{100 * time.Millisecond, 4, 10, 0, 0},
	} {
		wait, q := queueRule(c.deadline, c.b, c.capacity)
		if wait != c.wait || q != c.q {
			t.Errorf("queueRule(%v, B=%d, C=%v) = wait %v, Q %d; want %v, %d", c.deadline, c.b, c.capacity, wait, q, c.wait, c.q)
		}
		s := time.Duration(float64(c.b) / c.capacity * float64(time.Second))
		if wait > 0 && wait+2*s > c.deadline+time.Millisecond {
			t.Errorf("queueRule(%v, B=%d, C=%v): wait %v + 2·s %v exceeds the deadline", c.deadline, c.b, c.capacity, wait, 2*s)
		}
		// The queue drains within the wait at capacity, unless it is the
		// floor of B.
		if drain := time.Duration(float64(q) / c.capacity * float64(time.Second)); q > c.b && drain > wait {
			t.Errorf("queueRule(%v, B=%d, C=%v): Q %d drains in %v, more than the wait %v", c.deadline, c.b, c.capacity, q, drain, wait)
		}
	}
}

func TestArrivalsArePoissonAtTheRate(t *testing.T) {
	const rate = 1000.0
	length := 10 * time.Second
	a := arrivals(rate, length, 3)
	// 10 000 expected; the count of a Poisson process has σ = 100.
	if n := float64(len(a)); math.Abs(n-rate*length.Seconds()) > 400 {
		t.Errorf("%v arrivals in %v at %v/s", n, length, rate)
	}
	var sum, sq float64
	prev := time.Duration(0)
	for i, at := range a {
		if at < prev || at >= length {
			t.Fatalf("arrival %d at %v after %v, length %v", i, at, prev, length)
		}
		gap := (at - prev).Seconds()
		sum += gap
		sq += gap * gap
		prev = at
	}
	mean := sum / float64(len(a))
	cv := math.Sqrt(sq/float64(len(a))-mean*mean) / mean
	// Exponential gaps: mean 1/rate, coefficient of variation 1.
	if math.Abs(mean*rate-1) > 0.05 || math.Abs(cv-1) > 0.05 {
		t.Errorf("gaps: mean %v s, coefficient of variation %v; want %v s and 1", mean, cv, 1/rate)
	}
	if !slices.Equal(a, arrivals(rate, length, 3)) {
		t.Error("the same seed gave other arrivals")
	}
	if slices.Equal(a[:100], arrivals(rate, length, 4)[:100]) {
		t.Error("another seed gave the same arrivals")
	}
}

func TestOverloadInterruptedReportsThePhasesMeasured(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	jsonPath := filepath.Join(t.TempDir(), "overload.json")
	// Interrupted as the first phase reports: later phases do not run.
	r := runCmdCtx(t, ctx, nil, &clitest.CancelOn{Text: "goodput", Cancel: cancel}, "overload",
		"--capacity", "100", "--loads", "1,2", "--duration", "100ms", "--warmup", "0s",
		"--capacity-duration", "150ms", "--cpu-rows", "100", "--deadline", "10s", "--json", jsonPath)
	if r.Code != cli.ExitInterrupted {
		t.Fatalf("exit %d, stderr %q; want 130 after Ctrl-C", r.Code, r.Stderr)
	}
	rep := clitest.ReadJSON[overloadReport](t, jsonPath)
	if !rep.Interrupted || len(rep.Phases) != 1 || rep.Phases[0].Config != cfgPlain {
		t.Fatalf("interrupted %v, phases %+v; want the first phase alone", rep.Interrupted, rep.Phases)
	}
	if !strings.Contains(r.Stdout, "interrupted") {
		t.Errorf("table does not say it was interrupted:\n%s", r.Stdout)
	}
}

func TestOverloadRejectsBadInput(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no", "such", "dir")
	wantBadArgs(t, "overload", []badArgs{
		{[]string{"--loads", "0"}, []string{"--loads", `"0"`, "more than 0"}},
		{[]string{"--loads", "1,,3"}, []string{"--loads", `""`}},
		{[]string{"--loads", "x"}, []string{"--loads", `"x"`}},
		{[]string{"--configs", "plain,pool"}, []string{"--configs", `"pool"`, "plain, semaphore, waitfirst, fsbulkhead, fsadaptive, fsadaptive-wait, gate, static, adaptive or alone"}},
		{[]string{"--service", "10"}, []string{"--service", `"10"`, "not a duration"}},
		{[]string{"--service", "5ms,100ms"}, []string{"--service", "100ms", "below the deadline"}},
		{[]string{"--service", "5ms,5ms"}, []string{"--service", "5ms is given twice"}},
		{[]string{"--service", "1ms,2ms,3ms,4ms,5ms,6ms"}, []string{"--service", "at most 5"}},
		{[]string{"--service", "10ms", "--cpu-rows", "100"}, []string{"--cpu-rows 100 does nothing with --service 10ms"}},
		{[]string{"--configs", "semaphore", "--queue-wait", "10ms"}, []string{"--queue-wait does nothing without the gate"}},
		{[]string{"--duration", "0s"}, []string{"--duration", "0s"}},
		{[]string{"--warmup", "-1s"}, []string{"--warmup", "-1s"}},
		{[]string{"--deadline", "0s"}, []string{"--deadline", "0s"}},
		{[]string{"--cpu-rows", "0"}, []string{"--cpu-rows", "0"}},
		{[]string{"--capacity", "-1"}, []string{"--capacity", "-1"}},
		{[]string{"--capacity-duration", "0s"}, []string{"--capacity-duration", "0s"}},
		{[]string{"--max-concurrent", "0"}, []string{"--max-concurrent", "0"}},
		{[]string{"--max-queue", "-2"}, []string{"--max-queue", "-2"}},
		{[]string{"--queue-wait", "2h"}, []string{"--queue-wait", "2h0m0s"}},
		{[]string{"--chart", filepath.Join(t.TempDir(), "c.gif")}, []string{"--chart", `".gif"`, "want a file name ending in .svg"}},
		{[]string{"--chart", "c.png"}, []string{`--chart "c.png"`, "PNG is not supported", ".svg"}},
		{[]string{"--chart", filepath.Join(missing, "c.svg")}, []string{"--chart", "does not exist"}},
		{[]string{"--json", filepath.Join(missing, "r.json")}, []string{"--json", "does not exist"}},
		{[]string{"--dsn", "oracle://x"}, []string{"--dsn", `"oracle"`}},
		// Flags that would do nothing, and values that are not what a flag
		// wants.
		{[]string{"--configs", "plain,semaphore", "--queue-wait", "5ms"}, []string{"does nothing"}},
		{[]string{"--configs", "plain", "--dry-run"}, []string{"does nothing"}},
		{[]string{"--capacity", "100", "--capacity-workers", "2"}, []string{"does nothing"}},
		{[]string{"--fleet", "orders"}, []string{"--fleet does nothing in overload"}},
		{[]string{"--capacity", "fast"}, []string{`--capacity "fast": want a number`}},
		{[]string{"--seed", "-1"}, []string{`--seed "-1": want a non-negative integer`}},
		{[]string{"--max-concurrent", "0"}, []string{"--max-concurrent is 0, want an integer from 1"}},
	})
}

func TestOverloadOnPostgreSQLKeepsServerTransactionsWithinB(t *testing.T) {
	dsn := clitest.PostgresURL(t)
	jsonPath := filepath.Join(t.TempDir(), "overload.json")
	// A deadline far beyond any request: nothing is cancelled on the
	// server, which then sees exactly what each configuration lets
	// through. The unlimited pool is left out: it would open a connection
	// per request in flight.
	// Phases of a second: on a busy machine (a second test suite beside
	// this one) the monitor still polls while transactions are open.
	r := runCmd(t, nil, "overload", "--dsn", dsn, "--loads", "2", "--duration", "1s", "--warmup", "100ms",
		"--capacity-duration", "450ms", "--cpu-rows", "5000", "--max-concurrent", "2", "--max-queue", "2",
		"--queue-wait", "5ms", "--deadline", "30s", "--configs", "semaphore,gate", "--json", jsonPath)
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	rep := clitest.ReadJSON[overloadReport](t, jsonPath)
	if !rep.CapacityMeasured || rep.Capacity <= 0 || rep.ServerVersion == "" {
		t.Errorf("capacity %v measured %v, server version %q", rep.Capacity, rep.CapacityMeasured, rep.ServerVersion)
	}
	if len(rep.Phases) != 2 {
		t.Fatalf("%d phases, want semaphore and gate", len(rep.Phases))
	}
	arrived := countedArrivals(2*rep.Capacity, 100*time.Millisecond, time.Second, 1)
	for _, ph := range rep.Phases {
		wantPhaseAddsUp(t, ph, arrived)
		clitest.WantServerTx(t, ph.Config, ph.ServerMaxTx, ph.ServerMaxConns, ph.ServerError, 2)
	}
	// The pool of B: at most B server connections; the gate: at most what
	// bulkhead budget counts, B running plus B+Q idle, though it queues.
	if s, g := rep.Phases[0], rep.Phases[1]; *s.ServerMaxConns > 2 || *g.ServerMaxConns > 6 {
		t.Errorf("server connections: semaphore %d, gate %d; want at most B = 2 and B + (B+Q) = 6", *s.ServerMaxConns, *g.ServerMaxConns)
	}
	if !strings.Contains(r.Stdout, "srv tx") {
		t.Errorf("table lacks the server columns:\n%s", r.Stdout)
	}
}

func TestOverloadRejectsADeadlineNoRequestCanMeet(t *testing.T) {
	// 70000 rows take milliseconds: a deadline of 1ms is met by nothing.
	r := runCmd(t, nil, "overload", "--deadline", "1ms", "--capacity", "50", "--loads", "1", "--duration", "100ms",
		"--capacity-duration", "150ms", "--cpu-rows", "70000")
	lines := strings.Split(strings.TrimSuffix(r.Stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	if r.Code != cli.ExitError || r.Stdout != "" || !strings.HasPrefix(last, "bulkhead: overload: --deadline 1ms is not above the unloaded service time S") ||
		!strings.Contains(last, "want a deadline of a few times S") {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
	if strings.Contains(r.Stderr, "goodput") {
		t.Errorf("phases ran: %q", r.Stderr)
	}
}

// The waitfirst configuration and --service on PostgreSQL: each service
// time gets its own report, its rows scaled to it, and the chart puts the
// reports side by side.
func TestOverloadWithServiceTimesRunsEachWithWaitFirstBesideTheGate(t *testing.T) {
	dsn := clitest.PostgresURL(t)
	dir := t.TempDir()
	jsonPath, chartPath := filepath.Join(dir, "overload.json"), filepath.Join(dir, "overload.svg")
	r := runCmd(t, nil, "overload", "--dsn", dsn, "--service", "2ms,4ms", "--loads", "2", "--duration", "300ms", "--warmup", "100ms",
		"--capacity-duration", "450ms", "--max-concurrent", "2", "--max-queue", "2", "--queue-wait", "20ms", "--deadline", "30s",
		"--configs", "waitfirst,gate", "--json", jsonPath, "--chart", chartPath)
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	reps := *clitest.ReadJSON[[]*overloadReport](t, jsonPath) // one per service time
	if len(reps) != 2 {
		t.Fatalf("%d reports, want one per service time", len(reps))
	}
	for i, rep := range reps {
		if want := []float64{2, 4}[i]; rep.ServiceTargetMs != want {
			t.Errorf("report %d: service target %v ms, want %v", i, rep.ServiceTargetMs, want)
		}
		if len(rep.Phases) != 2 || rep.Phases[0].Config != cfgWaitFirst || rep.Phases[1].Config != cfgGate {
			t.Fatalf("report %d: phases %v, want waitfirst then gate", i, rep.Phases)
		}
		arrived := countedArrivals(2*rep.Capacity, 100*time.Millisecond, 300*time.Millisecond, 1)
		for _, ph := range rep.Phases {
			wantPhaseAddsUp(t, ph, arrived)
			if ph.ServerMaxTx != nil && *ph.ServerMaxTx > 2 {
				t.Errorf("report %d %s: %d transactions on the server at once, want at most B = 2", i, ph.Config, *ph.ServerMaxTx)
			}
		}
		if wf := rep.Phases[0]; wf.RejectedFull != 0 {
			t.Errorf("report %d: waitfirst rejected %d at once; its queue has no bound", i, wf.RejectedFull)
		}
	}
	if n := strings.Count(r.Stdout, "unloaded service time S"); n != 2 {
		t.Errorf("%d tables, want 2:\n%s", n, r.Stdout)
	}
	svg, err := os.ReadFile(chartPath)
	if err != nil {
		t.Fatal(err)
	}
	one, err := overloadChartSVG(reps[0])
	if err != nil {
		t.Fatal(err)
	}
	var h float64
	fmt.Sscanf(attr(string(one), "height"), "%g", &h)
	clitest.WantSVG(t, svg, overloadW, 2*h)
	if n := strings.Count(string(svg), "<svg "); n != 3 {
		t.Errorf("chart has %d svg elements, want the whole and one per service time", n)
	}
}

func TestOverloadChartOfNothingIsAnError(t *testing.T) {
	if err := writeOverloadChart(filepath.Join(t.TempDir(), "c.svg"), []*overloadReport{{}}); err == nil {
		t.Fatal("an overload chart without phases was written")
	}
}
