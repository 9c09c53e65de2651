package main

import (
	"context"
	"database/sql"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
)

func TestOverloadShapeFlagsRejectBadValuesInOneLine(t *testing.T) {
	wantBadArgs(t, "overload", []badArgs{
		{[]string{"--shape", "disk"}, []string{`--shape "disk"`, `"disk" is not a shape`, "cpu, sleep, mix, outlier, lock, hotrow or roundtrips"}},
		{[]string{"--shape", "cpu,"}, []string{`--shape "cpu,"`, `"" is not a shape`}},
		{[]string{"--shape", "sleep"}, []string{"--shape sleep needs PostgreSQL, not SQLite", "want --dsn postgres://..., or --shape cpu"}},
		{[]string{"--configs", "static", "--sweep", "0"}, []string{`--sweep "0"`, `"0" is not a B`, "integers from 1 to 10000"}},
		{[]string{"--configs", "static", "--sweep", "1,x"}, []string{`--sweep "1,x"`, `"x" is not a B`}},
		{[]string{"--configs", "static", "--sweep", "2,4,2"}, []string{`--sweep "2,4,2"`, "2 is given twice"}},
		{[]string{"--configs", "static", "--sweep", "1,2,3,4,5,6,7,8,9"}, []string{"--sweep", "9 values, want at most 8"}},
		{[]string{"--configs", "gate", "--sweep", "1,2"}, []string{"--sweep 1,2 does nothing without the static configuration (--configs gate)"}},
		{[]string{"--shift", "3", "--shape", "cpu,mix"}, []string{"--shift 3 multiplies the cpu query's rows", "want --shape cpu alone with it, not cpu,mix"}},
		{[]string{"--lock-hold", "1s"}, []string{"--lock-hold does nothing without the lock shape (--shape cpu)"}},
		{[]string{"--shape", "lock", "--lock-hold", "0s"}, []string{"--lock-hold is 0s, want more than 0s and at most 1h0m0s"}},
		{[]string{"--shape", "lock", "--lock-hold", "soon"}, []string{`--lock-hold "soon"`, "want a Go duration"}},
		{[]string{"--shape", "lock", "--duration", "2s", "--lock-hold", "1500ms"}, []string{"--lock-hold is 1.5s, want it to end within --duration 2s", "taken 500ms into it", "below 1.5s"}},
		{[]string{"--outlier-every", "1s"}, []string{"--outlier-every does nothing without the outlier shape"}},
		{[]string{"--shape", "outlier", "--outlier-every", "-1s"}, []string{"--outlier-every is -1s, want more than 0s"}},
		{[]string{"--shape", "outlier", "--outlier-max", "2m"}, []string{"--outlier-max is 2m0s, want more than 0s and at most 1m0s"}},
		{[]string{"--cold=maybe"}, []string{`--cold "maybe"`, "want true or false"}},
	})
}

// testShapeConfig is a configuration for building shapes without a
// server: S = 10ms, a deadline of 100ms.
func testShapeConfig() *overloadConfig {
	return &overloadConfig{target: &cli.Target{Dialect: cli.DialectPostgres}, deadline: 100 * time.Millisecond,
		duration: 4 * time.Second, lockHold: time.Second, outlierEvery: time.Second, outlierMax: 2 * time.Second}
}

func TestShapePlansAreTheSameForTheSameSeedAndKeepTheirMix(t *testing.T) {
	cfg := testShapeConfig()
	u := unit{rows: 1000, s: 10 * time.Millisecond}
	starts := arrivals(1000, 10*time.Second, 5)
	kinds := func(reqs []request) []int {
		out := make([]int, len(reqs))
		for i, r := range reqs {
			out[i] = r.kind
		}
		return out
	}
	for _, name := range overloadShapes {
		sh := newShape(cfg, name, u)
		a, b := sh.plan(starts, 9), sh.plan(starts, 9)
		if len(a) != len(starts) || !slices.Equal(kinds(a), kinds(b)) {
			t.Errorf("%s: two plans of one seed differ", name)
		}
		counts := make([]int, len(sh.kinds))
		for _, r := range a {
			counts[r.kind]++
			if r.op == nil {
				t.Fatalf("%s: a request without an operation", name)
			}
		}
		switch name {
		case shapeMix:
			// 10% slow, with 30 times the deadline: σ of the share is 0.3%.
			if share := float64(counts[1]) / float64(len(a)); math.Abs(share-mixSlowShare) > 0.015 {
				t.Errorf("mix: %.3f of the requests slow, want %v", share, mixSlowShare)
			}
			for _, r := range a {
				if want := map[int]time.Duration{0: cfg.deadline, 1: 30 * cfg.deadline}[r.kind]; r.deadline != want {
					t.Fatalf("mix: a request of kind %s has deadline %v, want %v", sh.kinds[r.kind], r.deadline, want)
				}
			}
		case shapeOutlier:
			// One per second of arrivals; 1000·S = 10s, capped at 2s, plus
			// the deadline.
			if counts[1] != 10 {
				t.Errorf("outlier: %d outliers in 10s of arrivals, want one per second", counts[1])
			}
			for i, r := range a {
				if r.kind == 1 && r.deadline != 2100*time.Millisecond {
					t.Errorf("outlier at %v: deadline %v, want 2.1s", starts[i], r.deadline)
				}
			}
			if slices.Equal(kinds(a), kinds(sh.plan(starts, 10))) {
				t.Error("outlier: another seed put the outliers on the same arrivals")
			}
		case shapeRoundTrips:
			for k, n := range counts {
				if n < len(a)/len(rtKinds)/2 {
					t.Errorf("roundtrips: %d transactions of kind %s of %d", n, sh.kinds[k], len(a))
				}
			}
		default:
			if len(sh.kinds) != 1 {
				t.Errorf("%s: kinds %v, want one", name, sh.kinds)
			}
		}
	}
	// About 15 round trips each, BEGIN and COMMIT included.
	var trips float64
	for _, k := range rtKinds {
		trips += float64(k.reads+k.writes+2) / float64(len(rtKinds))
	}
	if trips < 13 || trips > 17 {
		t.Errorf("roundtrips: %.1f round trips per transaction on average, want about 15", trips)
	}
}

// summaryReport is a hand-made report: static B 1, 2 and 4 beside the
// gate, adaptive and fsbulkhead, at 1×C and 3×C (1000 arrivals per C),
// its phases in the order of a run: by load, then configuration.
func summaryReport() *overloadReport {
	type at struct {
		goodput             float64
		full, timeout, late int64
		dials               float64
	}
	configs := []struct {
		name string
		at   [2]at // at 1×C, 3×C
	}{
		{cfgFsBulkhead, [2]at{{90, 0, 50, 0, 4}, {50, 0, 2000, 0, 10}}},
		{cfgGate, [2]at{{180, 10, 20, 30, 0}, {160, 1500, 100, 400, 0}}},
		{staticName(1), [2]at{{200, 0, 0, 0, 0}, {100, 0, 0, 0, 0}}},
		{staticName(2), [2]at{{150, 0, 0, 0, 0.5}, {200, 0, 0, 0, 0}}},
		{staticName(4), [2]at{{200, 0, 0, 0, 0}, {150, 0, 0, 0, 0}}},
		{cfgAdaptive, [2]at{{210, 0, 5, 0, 1}, {0, 0, 0, 0, 2}}},
	}
	rep := &overloadReport{Shape: shapeHotRow}
	for i, load := range []float64{1, 3} {
		for _, c := range configs {
			a := c.at[i]
			rep.Phases = append(rep.Phases, &overloadPhase{Load: load, Config: c.name, GoodputPerS: a.goodput, Arrived: int64(1000 * load),
				RejectedFull: a.full, RejectedTimeout: a.timeout, RejectedDeadline: a.late, DialsPerS: a.dials})
		}
	}
	return rep
}

func TestSummaryDividesEachGoodputByTheBestStaticB(t *testing.T) {
	shapes := summarizeShapes([]*overloadReport{summaryReport(), {Shape: shapeSleep}})
	if len(shapes) != 1 {
		t.Fatalf("%d shapes, want the one with phases", len(shapes))
	}
	sh := shapes[0]
	// At 1×C B=1 and B=4 tie at 200/s: the lower B is the best.
	if sh.label != shapeHotRow || !slices.Equal(sh.loads, []float64{1, 3}) || !slices.Equal(sh.best, []int{1, 2}) {
		t.Fatalf("label %q, loads %v, best B %v; want hotrow, 1 and 3, B 1 and 2", sh.label, sh.loads, sh.best)
	}
	want := map[string]summaryRow{
		cfgFsBulkhead: {vsBest: []float64{0.45, 0.25}, refused: 0.05, dials: []float64{4, 10}},
		cfgGate:       {vsBest: []float64{0.9, 0.8}, refused: 0.06, dials: []float64{0, 0}},
		staticName(1): {vsBest: []float64{1, 0.5}, refused: 0, dials: []float64{0, 0}},
		staticName(2): {vsBest: []float64{0.75, 1}, refused: 0, dials: []float64{0.5, 0}},
		staticName(4): {vsBest: []float64{1, 0.75}, refused: 0, dials: []float64{0, 0}},
		cfgAdaptive:   {vsBest: []float64{1.05, 0}, refused: 0.005, dials: []float64{1, 2}},
	}
	var order []string
	for _, r := range sh.rows {
		order = append(order, r.config)
		w := want[r.config]
		near := func(a, b []float64) bool {
			return slices.EqualFunc(a, b, func(x, y float64) bool { return math.Abs(x-y) < 1e-9 })
		}
		if !near(r.vsBest, w.vsBest) || math.Abs(r.refused-w.refused) > 1e-9 || !near(r.dials, w.dials) {
			t.Errorf("%s: ÷ best %v, refused %v, dials %v; want %v, %v, %v", r.config, r.vsBest, r.refused, r.dials, w.vsBest, w.refused, w.dials)
		}
	}
	if wantOrder := []string{cfgFsBulkhead, cfgGate, staticName(1), staticName(2), staticName(4), cfgAdaptive}; !slices.Equal(order, wantOrder) {
		t.Errorf("rows %v, want the phases' order %v", order, wantOrder)
	}

	// Without a static configuration or a 1×C phase there is nothing to
	// divide by: NaN, printed "-".
	rep := &overloadReport{Shape: shapeCPU, Phases: []*overloadPhase{{Load: 3, Config: cfgGate, GoodputPerS: 100, Arrived: 10}}}
	r := summarizeShapes([]*overloadReport{rep})[0]
	if r.best[0] != 0 || !math.IsNaN(r.rows[0].vsBest[0]) || !math.IsNaN(r.rows[0].refused) {
		t.Errorf("no static, no 1×C: best %v, row %+v; want 0 and NaN", r.best, r.rows[0])
	}
	var out strings.Builder
	printSummary(&out, []*overloadReport{summaryReport(), rep})
	clitest.WantCells(t, out.String(), "hotrow best static B 1 2", "hotrow adaptive 1.05 0.00 0.5% 1.0 / 2.0", "cpu gate - - 0.0\n")
}

func TestBestStaticIsSetOnTheReportAndEachPhaseIsComparedWithIt(t *testing.T) {
	rep := &overloadReport{}
	all := summaryReport().Phases[6:] // 3×C
	rep.addMedians(all, []string{cfgFsBulkhead, cfgGate, staticName(1), staticName(2), staticName(4), cfgAdaptive})
	if len(rep.BestStatic) != 1 || rep.BestStatic[0] != (bestStatic{Load: 3, Config: staticName(2), B: 2, GoodputPerS: 200}) {
		t.Fatalf("best static %+v, want static-2 at 3×C", rep.BestStatic)
	}
	for _, ph := range rep.Phases {
		if ph.GoodputVsBest == nil || *ph.GoodputVsBest != ph.GoodputPerS/200 {
			t.Errorf("%s: goodput ÷ best %v, want %v", ph.Config, ph.GoodputVsBest, ph.GoodputPerS/200)
		}
	}
}

func TestLockFiguresCountTheArrivalsOfTheSecondAfterTheRelease(t *testing.T) {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	l := &lockHolder{locked: ms(2000), released: ms(3000)}
	// The counted time runs from 1s to 5s of the phase.
	goods := []goodRec{
		{at: ms(2990), done: ms(3020)}, // arrived before the release
		{at: ms(3100), done: ms(3400)},
		{at: ms(3200), done: ms(3250)}, // the first to commit of those after
		{at: ms(3999), done: ms(4050)},
		{at: ms(4000), done: ms(4010)}, // a second after: not counted
	}
	ph := &overloadPhase{}
	ph.lockFigures(l, goods, ms(1000), ms(5000))
	if ph.LockAtMs == nil || *ph.LockAtMs != 1000 || ph.LockReleaseMs == nil || *ph.LockReleaseMs != 2000 {
		t.Errorf("locked at %v, released at %v; want 1000 and 2000 ms into the counted time", ph.LockAtMs, ph.LockReleaseMs)
	}
	if ph.GoodAfterRelease == nil || *ph.GoodAfterRelease != 3 {
		t.Errorf("goodput after the release %v, want 3/s", ph.GoodAfterRelease)
	}
	if ph.FirstAfterRelMs == nil || *ph.FirstAfterRelMs != 250 {
		t.Errorf("first after the release %v, want 250 ms", ph.FirstAfterRelMs)
	}
	// Released 500ms before the end: the window is what is left.
	ph = &overloadPhase{}
	ph.lockFigures(&lockHolder{locked: ms(4000), released: ms(4500)}, []goodRec{{at: ms(4600), done: ms(4700)}}, ms(1000), ms(5000))
	if ph.GoodAfterRelease == nil || *ph.GoodAfterRelease != 2 {
		t.Errorf("goodput after a release 500ms before the end %v, want 1 in 0.5s", ph.GoodAfterRelease)
	}

	tl := timeline(goods, ms(3000), ms(1100))
	if want := []float64{8, 0, 0, 4, 10}; !slices.Equal(tl, want) {
		t.Errorf("timeline %v, want %v (the last step 100ms long)", tl, want)
	}
	if r := reachMs(tl, 4); r == nil || *r != 250 {
		t.Errorf("reach of 4/s %v, want the end of the first step", r)
	}
	if r := reachMs(tl, 9); r == nil || *r != 1250 {
		t.Errorf("reach of 9/s %v, want the end of the last step", r)
	}
	if r := reachMs(tl, 11); r != nil {
		t.Errorf("reach of 11/s %v, want never", *r)
	}
}

func TestOverloadColdStartsWithNoConnectionAndReportsItsFirstSecond(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "overload.json")
	r := runCmd(t, nil, "overload", "--capacity", "100", "--loads", "1", "--duration", "1200ms", "--warmup", "0s",
		"--capacity-duration", "150ms", "--cpu-rows", "200", "--max-concurrent", "2", "--deadline", "10s",
		"--configs", "semaphore,gate", "--cold", "--json", jsonPath)
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	rep := clitest.ReadJSON[overloadReport](t, jsonPath)
	if !rep.Cold || len(rep.Phases) != 2 {
		t.Fatalf("cold %v, %d phases; want cold, semaphore and gate", rep.Cold, len(rep.Phases))
	}
	for _, ph := range rep.Phases {
		wantPhaseAddsUp(t, ph, countedArrivals(100, 0, 1200*time.Millisecond, 1))
		// Nothing dialed before: the first requests dial, in the counted time.
		if ph.Dials < 1 || ph.DialsPerS <= 0 {
			t.Errorf("%s: %d dials, %v per second; want the first dials counted", ph.Config, ph.Dials, ph.DialsPerS)
		}
		if len(ph.ColdTimeline) != 5 || ph.ColdFirstSPerS == nil || ph.ColdReachMs == nil {
			t.Errorf("%s: cold timeline %v, first second %v, reach %v; want 5 steps of 250ms and both figures", ph.Config, ph.ColdTimeline, ph.ColdFirstSPerS, ph.ColdReachMs)
		}
	}
	if !strings.Contains(r.Stdout, "cold start: goodput") {
		t.Errorf("table lacks the cold start:\n%s", r.Stdout)
	}
}

// Each shape's statements, run on PostgreSQL: every request commits (the
// deadlines are seconds), through the pool as a semaphore and the static
// gates at B = 1 and 2, and the summary names every shape.
func TestOverloadRunsEveryShapeOnPostgreSQL(t *testing.T) {
	dsn := clitest.PostgresURL(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	counters := func() (hot, rt int64) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The experiment creates the tables; before its first run they may
		// not exist yet.
		db.QueryRowContext(ctx, "SELECT coalesce(sum(n), 0) FROM bulkhead_shape_hot").Scan(&hot)
		db.QueryRowContext(ctx, "SELECT coalesce(sum(n), 0) FROM bulkhead_shape_rt_b").Scan(&rt)
		return hot, rt
	}
	hot0, rt0 := counters()
	jsonPath := filepath.Join(t.TempDir(), "overload.json")
	r := runCmd(t, nil, "overload", "--dsn", dsn, "--shape", strings.Join(overloadShapes, ","), "--loads", "1",
		"--duration", "300ms", "--warmup", "100ms", "--capacity", "50", "--capacity-duration", "150ms", "--cpu-rows", "2000",
		"--max-concurrent", "2", "--deadline", "5s", "--configs", "semaphore,static", "--sweep", "1,2",
		"--lock-hold", "100ms", "--outlier-every", "100ms", "--outlier-max", "20ms", "--json", jsonPath)
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	reps := *clitest.ReadJSON[[]*overloadReport](t, jsonPath)
	var got []string
	for _, rep := range reps {
		got = append(got, rep.Shape)
	}
	if !slices.Equal(got, overloadShapes) {
		t.Fatalf("reports of shapes %v, want %v", got, overloadShapes)
	}
	arrived := countedArrivals(50, 100*time.Millisecond, 300*time.Millisecond, 1)
	var hotCommits int64
	for _, rep := range reps {
		var configs []string
		for _, ph := range rep.Phases {
			configs = append(configs, ph.Config)
			wantPhaseAddsUp(t, ph, arrived)
			if ph.Committed != ph.Arrived {
				t.Errorf("%s %s: %d of %d committed, errors %v", rep.Shape, ph.Config, ph.Committed, ph.Arrived, ph.ErrorSamples)
			}
			if ph.Dials < 1 || ph.GoodputVsBest == nil {
				t.Errorf("%s %s: %d dials, goodput ÷ best %v; want the warm pool's dials and a ratio", rep.Shape, ph.Config, ph.Dials, ph.GoodputVsBest)
			}
			if rep.Shape == shapeHotRow {
				hotCommits += ph.Committed + int64(ph.WarmupOutcomes["committed"])
			}
		}
		if want := []string{cfgSemaphore, staticName(1), staticName(2)}; !slices.Equal(configs, want) {
			t.Errorf("%s: phases %v, want %v", rep.Shape, configs, want)
		}
		if len(rep.BestStatic) != 1 {
			t.Errorf("%s: best static %+v, want one at 1×C", rep.Shape, rep.BestStatic)
		}
		switch rep.Shape {
		case shapeOutlier:
			for _, ph := range rep.Phases {
				if c := ph.ByKind["outlier"]; c == nil || c.Arrived < 1 || c.WithinDeadline != c.Arrived {
					t.Errorf("outlier %s: outliers %+v, want some, each in time", ph.Config, c)
				}
			}
		case shapeLock:
			for _, ph := range rep.Phases {
				if ph.LockError != "" || ph.LockAtMs == nil || ph.LockReleaseMs == nil || *ph.LockReleaseMs-*ph.LockAtMs < 100 {
					t.Errorf("lock %s: error %q, locked %v, released %v; want held 100ms", ph.Config, ph.LockError, ph.LockAtMs, ph.LockReleaseMs)
				}
				if ph.GoodAfterRelease == nil || ph.FirstAfterRelMs == nil {
					t.Errorf("lock %s: goodput after the release %v, first after it %v", ph.Config, ph.GoodAfterRelease, ph.FirstAfterRelMs)
				}
			}
		case shapeMix, shapeRoundTrips:
			if len(rep.Kinds) < 2 || rep.Phases[0].ByKind == nil {
				t.Errorf("%s: kinds %v, by kind %v", rep.Shape, rep.Kinds, rep.Phases[0].ByKind)
			}
		}
	}
	// The writes reached the tables: the hot row counts every commit
	// (capacity and S runs too), the roundtrips tables some.
	hot1, rt1 := counters()
	if hot1-hot0 < hotCommits || rt1 <= rt0 {
		t.Errorf("hot row %d → %d (%d commits counted), roundtrips %d → %d", hot0, hot1, hotCommits, rt0, rt1)
	}
	clitest.WantCells(t, r.Stdout, "summary, shape × configuration", "roundtrips best static B", "table locked at", "in time by kind: fast")
}
