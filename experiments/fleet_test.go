package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/svg"
	"github.com/dbbulkhead/bulkhead/fleet"
	"github.com/dbbulkhead/bulkhead/internal/syncbuf"
)

const testPG = "postgres://postgres@127.0.0.1:5432/test"

func TestFleetRejectsBadInput(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no", "such", "dir")
	for _, c := range []badArgs{
		{[]string{"--arms", "fleet,proxy"}, []string{"--arms", `"proxy"`, "one, static4, static8, fleet or pgbouncer"}},
		{[]string{"--members", "0"}, []string{"--members is 0", "1 to 16"}},
		{[]string{"--service", "500ms"}, []string{"--service is 500ms", "less than the deadline (500ms)"}},
		{[]string{"--load", "0"}, []string{"--load is 0", "more than 0"}},
		{[]string{"--load", "lots"}, []string{`--load "lots": want a number`}},
		{[]string{"--phase", "0s"}, []string{"--phase is 0s"}},
		{[]string{"--warmup", "-1s"}, []string{"--warmup is -1s"}},
		{[]string{"--fleet-interval", "5ms"}, []string{"--fleet-interval is 5ms", "10ms to"}},
		{[]string{"--poll", "0s"}, []string{"--poll is 0s", "1ms to 1s"}},
		{[]string{"--arms", "one,static4", "--fleet-interval", "500ms"}, []string{"--fleet-interval does nothing without the fleet arm"}},
		{[]string{"--arms", "fleet", "--pgbouncer", "/bin/true"}, []string{"--pgbouncer does nothing without the pgbouncer arm"}},
		{[]string{"--phase", "1s"}, []string{"--phase 1s is shorter than two fleet intervals", "at least 2s"}},
		{[]string{"--max-concurrent", "0"}, []string{"--max-concurrent is 0"}},
		{[]string{"--max-concurrent", "2000"}, []string{"T is 2000", "from --max-concurrent", "1 to 1000"}},
		{[]string{"--queue-wait", "0s", "--max-queue", "4"}, []string{"policy", "invalid", "QueueWait 0s"}},
		{[]string{"--dry-run"}, []string{"--dry-run does nothing in fleet"}},
		{[]string{"--workloads", "batch:1:0:0s"}, []string{"--workloads does nothing in fleet"}},
		{[]string{"--chart", "fleet.png"}, []string{"--chart", "PNG is not supported"}},
		{[]string{"--json", filepath.Join(missing, "f.json")}, []string{"--json", "does not exist"}},
		{[]string{"--dsn", "mysql://root@127.0.0.1:3306/test"}, []string{"is MySQL", "runs on PostgreSQL"}},
		{[]string{"--dsn", "oracle://x"}, []string{"--dsn", `"oracle"`}},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			args := append([]string{"fleet"}, c.args...)
			if !slices.Contains(c.args, "--dsn") {
				args = append(args, "--dsn", testPG)
			}
			clitest.WantOneLineError(t, runCmd(t, nil, args...), append([]string{"fleet:"}, c.want...)...)
		})
	}
	// No database at all: the experiment needs PostgreSQL.
	clitest.WantOneLineError(t, runCmd(t, nil, "fleet"), "fleet:", "--dsn", "DATABASE_URL")
	// A malformed variable names itself and the flag that overrides it.
	clitest.WantOneLineError(t, runCmd(t, map[string]string{cli.EnvMaxConcurrent: "eight"}, "fleet", "--dsn", testPG),
		"fleet:", cli.EnvMaxConcurrent, `"eight"`, "--max-concurrent overrides it")
}

func TestFleetHelpListsItsFlagsAndHidesTheMemberCommand(t *testing.T) {
	r := runCmd(t, nil, "fleet", "--help")
	if r.Code != cli.ExitOK || r.Stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	for _, want := range []string{"Usage: experiments fleet", "static4", "pgbouncer", "--fleet-interval", "--members",
		"(default 8, T: the service's total, or $BULKHEAD_MAX_CONCURRENT)", "(default deadline − 2·S, by the rule, or $BULKHEAD_QUEUE_WAIT)",
		"Examples:\n  experiments fleet"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("fleet --help lacks %q:\n%s", want, r.Stdout)
		}
	}
	top := runCmd(t, nil, "--help").Stdout
	if !strings.Contains(top, "experiments fleet") || strings.Contains(top, fleetMemberCmd) {
		t.Errorf("top-level help: lists fleet %v, lists the hidden %s %v", strings.Contains(top, "experiments fleet"), fleetMemberCmd, strings.Contains(top, fleetMemberCmd))
	}
	// The hidden command takes its configuration on stdin, no argument.
	clitest.WantOneLineError(t, runCmd(t, nil, fleetMemberCmd, "--arm", "fleet"), fleetMemberCmd+":", "stdin", `"--arm"`)
}

func TestFleetArmsGetTheirShareOfTAndTheQueueByTheRule(t *testing.T) {
	parse := func(vars map[string]string, args ...string) *fleetConfig {
		t.Helper()
		ce, _, errb := program.Env(vars, false)
		cfg, code, done := (&env{ce}).parseFleet(append(args, "--dsn", testPG))
		if done {
			t.Fatalf("%v: exit %d, %s", args, code, errb)
		}
		return cfg
	}
	policies := func(cfg *fleetConfig) string {
		var out []string
		for _, a := range []string{armOne, armStatic4, armStatic8, armFleet} {
			p := cfg.armPolicy(a)
			out = append(out, fmt.Sprintf("%s B=%d Q=%d wait=%v", a, p.MaxConcurrent, p.MaxQueue, p.QueueWait))
		}
		return strings.Join(out, "; ")
	}
	// T = 8, S = 50ms, D = 500ms: wait = 400ms; Q = max(B, ⌊B/S·wait⌋) = 8·B.
	cfg := parse(nil)
	if got, want := policies(cfg), "one B=8 Q=64 wait=400ms; static4 B=2 Q=16 wait=400ms; static8 B=1 Q=8 wait=400ms; fleet B=8 Q=64 wait=400ms"; got != want {
		t.Errorf("defaults: %s\nwant %s", got, want)
	}
	if cfg.rate() != 240 || !slices.Equal(cfg.arms, fleetArms) || cfg.members != 4 {
		t.Errorf("rate %v, arms %v, members %d; want 240/s, all, 4", cfg.rate(), cfg.arms, cfg.members)
	}
	// T from the environment, Q (the fleet's total) and the wait by flag:
	// the static gates get Q in proportion to B.
	cfg = parse(map[string]string{cli.EnvMaxConcurrent: "16"}, "--max-queue", "32", "--queue-wait", "20ms", "--arms", "static8,one")
	if got, want := policies(cfg), "one B=16 Q=32 wait=20ms; static4 B=4 Q=8 wait=20ms; static8 B=2 Q=4 wait=20ms; fleet B=16 Q=32 wait=20ms"; got != want {
		t.Errorf("given: %s\nwant %s", got, want)
	}
	if !slices.Equal(cfg.arms, []string{armOne, armStatic8}) {
		t.Errorf("arms %v, want the experiment's order", cfg.arms)
	}
	// A T below 8 still gives every static member a permit.
	cfg = parse(nil, "--max-concurrent", "2", "--service", "40ms", "--deadline", "100ms")
	if got, want := policies(cfg), "one B=2 Q=2 wait=20ms; static4 B=1 Q=1 wait=20ms; static8 B=1 Q=1 wait=20ms; fleet B=2 Q=2 wait=20ms"; got != want {
		t.Errorf("T=2: %s\nwant %s", got, want)
	}
}

func TestFleetSplitAndSettleTimes(t *testing.T) {
	for _, c := range []struct {
		total, n int
		want     []int
	}{{8, 1, []int{8}}, {8, 3, []int{3, 3, 2}}, {8, 7, []int{2, 1, 1, 1, 1, 1, 1}}, {4, 6, []int{1, 1, 1, 1, 0, 0}}} {
		if got := fleetSplit(c.total, c.n); !slices.Equal(got, c.want) {
			t.Errorf("fleetSplit(%d, %d) = %v, want %v", c.total, c.n, got, c.want)
		}
	}
	const s = int64(time.Second)
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	shares := []shareChange{
		{member: 0, t: ms(100), b: 4}, // alone at its first round
		{member: 1, t: ms(150), b: 0}, // the newcomer finds no slot free
		{member: 0, t: ms(1100), b: 2},
		{member: 1, t: ms(1300), b: 2}, // settled: [2 2]
		{member: 2, t: ms(3000), b: 0}, // a third joins
		{member: 0, t: ms(3900), b: 2}, // T=4 over 3: [2 1 1]
		{member: 1, t: ms(4000), b: 1},
	}
	start := eventRec{t: 0, kind: "start", members: []int{0, 1}, live: []int{0, 1}}
	if d, ok := settleTime(start, 3*s, shares, 4); !ok || d != 1300*time.Millisecond {
		t.Errorf("two members: settled %v after %v, want after 1.3s", ok, d)
	}
	join := eventRec{t: ms(2990), kind: "start", members: []int{2}, live: []int{0, 1, 2}}
	if _, ok := settleTime(join, 5*s, shares, 4); ok {
		t.Errorf("three members: settled, though member 2 never took its slot")
	}
	// Already settled at the event: 0.
	stop := eventRec{t: ms(2000), kind: "stop", members: []int{9}, live: []int{0, 1}}
	if d, ok := settleTime(stop, ms(2500), shares, 4); !ok || d != 0 {
		t.Errorf("already settled: %v after %v, want at once", ok, d)
	}
	// Not within the window: the next event came first.
	if _, ok := settleTime(start, ms(1200), shares, 4); ok {
		t.Errorf("settled before the window ended at 1.2s")
	}
}

// cannedFleetArm is what a fleet arm of two members reports: the data
// summarize reads, with a known outcome.
func cannedFleetArm() *armData {
	const s = int64(time.Second)
	t0 := 1000 * s
	at := func(ms int64) int64 { return t0 + ms*int64(time.Millisecond) }
	return &armData{
		t0: t0,
		phases: []phaseSpan{
			{name: phaseStart, begin: t0, end: at(2000)},
			{name: phaseSteady, begin: at(2000), end: at(5000)},
		},
		members: []fleetMemberInfo{{Index: 0, ReadyS: ptr(0.05)}, {Index: 1, ReadyS: ptr(0.08)}},
		events: []eventRec{
			{t: t0, kind: "start", members: []int{0, 1}, live: []int{0, 1}, phase: 0},
			{t: at(3000), kind: "stop", members: []int{0}, live: []int{1}, phase: 1},
		},
		shares: []shareChange{
			{member: 1, t: at(1200), b: 2}, // out of order: summarize sorts
			{member: 0, t: at(100), b: 4},
			{member: 0, t: at(1000), b: 2},
			{member: 0, t: at(3010), b: 0},
			{member: 1, t: at(3500), b: 4},
		},
		reports: []memberReport{
			{member: 0, msg: memberMsg{Type: msgReport, Phase: 0, Dials: 3, OK: 3, Full: 2, OKUs: []int64{10_000, 12_000, 30_000}, FailUs: []int64{50, 70}}},
			{member: 1, msg: memberMsg{Type: msgReport, Phase: 0, Dials: 2, OK: 1, Timeout: 1, OKUs: []int64{20_000}, FailUs: []int64{80_000}}},
			{member: 1, msg: memberMsg{Type: msgReport, Phase: 1, Dials: 7, OK: 6, Deadline: 1, Late: 1, Other: 1, Timeout: 1,
				OKUs: []int64{10_000, 10_000, 10_000, 10_000, 10_000, 90_000}, FailUs: []int64{100_000, 120_000, 5, 40},
				Errors: map[string]int{"boom": 1}}},
		},
		samples: []fleetSample{{t: at(500), tx: 3, conns: 5}, {t: at(1999), tx: 4, conns: 4}, {t: at(2500), tx: 2, conns: 6}, {t: at(4999), tx: 4, conns: 4}, {t: at(6000), tx: 9, conns: 9}},
	}
}

func TestFleetSummaryCountsEachPhaseFromTheMembersReports(t *testing.T) {
	arm := summarize(cannedFleetArm(), 100*time.Millisecond, 4, true)
	if len(arm.Phases) != 2 {
		t.Fatalf("%d phases, want 2", len(arm.Phases))
	}
	start, steady := arm.Phases[0], arm.Phases[1]
	if start.Succeeded != 4 || start.RejectedFull != 2 || start.RejectedTimeout != 1 || start.Arrived != 7 || start.GoodputPerS != 2 || start.OfferedPerS != 3.5 {
		t.Errorf("start: %+v", start)
	}
	if steady.Succeeded != 6 || steady.Arrived != 10 || steady.DeadlineExceeded != 1 || steady.Late != 1 || steady.Other != 1 || steady.RejectedTimeout != 1 || steady.ErrorSamples["boom"] != 1 {
		t.Errorf("steady: %+v", steady)
	}
	if start.SuccessMs == nil || start.SuccessMs.P99 != 30 || steady.FailureMs == nil || steady.FailureMs.P99 != 120 {
		t.Errorf("p99: start successes %+v, steady failures %+v", start.SuccessMs, steady.FailureMs)
	}
	// The server's most per phase: a sample after the arm's end counts
	// in none.
	if start.Dials != 5 || steady.Dials != 5 {
		t.Errorf("dials: start %d, steady %d; want 5 and 5", start.Dials, steady.Dials)
	}
	if intOr(start.ServerMaxConns) != "5" || intOr(steady.ServerMaxConns) != "6" {
		t.Errorf("server sessions: start %s, steady %s; want 5 and 6", intOr(start.ServerMaxConns), intOr(steady.ServerMaxConns))
	}
	if intOr(start.ServerMaxTx) != "4" || intOr(steady.ServerMaxTx) != "4" || start.Polls != 2 || steady.Polls != 2 {
		t.Errorf("server: start %s in %d polls, steady %s in %d polls", intOr(start.ServerMaxTx), start.Polls, intOr(steady.ServerMaxTx), steady.Polls)
	}
	if start.members() != "0→2" || steady.members() != "2→1" {
		t.Errorf("members: start %q, steady %q", start.members(), steady.members())
	}
	// Settled [2 2] at 1.2s; after the stop, [4] at 3.5s.
	if len(arm.Events) != 2 || arm.Events[0].SettleS == nil || *arm.Events[0].SettleS != 1.2 || arm.Events[1].SettleS == nil || *arm.Events[1].SettleS != 0.5 {
		t.Fatalf("events %+v", arm.Events)
	}
	if r := arm.Events[0].ReadyS; r == nil || *r != 0.08 || arm.Events[1].ReadyS != nil {
		t.Errorf("start: processes ready after %v, stop: %v; want 0.08s and nothing", r, arm.Events[1].ReadyS)
	}
	if *start.SettleMaxS != 1.2 || *steady.SettleMaxS != 0.5 {
		t.Errorf("settle per phase: %v, %v", *start.SettleMaxS, *steady.SettleMaxS)
	}
	// The sum of the shares, a step at each change.
	var sum []string
	for _, p := range arm.ShareSum {
		sum = append(sum, fmt.Sprintf("%g:%g", p.T, p.V))
	}
	if got, want := strings.Join(sum, " "), "0:0 0.1:4 1:2 1.2:4 3.01:2 3.5:4"; got != want {
		t.Errorf("share sum %s, want %s", got, want)
	}
	if len(arm.Shares) != 5 || arm.Shares[0] != (fleetShare{T: 0.1, Member: 0, B: 4}) {
		t.Errorf("shares %+v", arm.Shares)
	}
	if len(arm.ServerTx) != 4 || arm.ServerTx[0].V != 3 || arm.ServerTx[3].V != 4 {
		t.Errorf("server series %+v", arm.ServerTx)
	}
}

// cannedFleetReport is a whole run: the baseline, two static arms,
// PgBouncer and the fleet.
func cannedFleetReport() *fleetReport {
	rep := &fleetReport{Database: "postgres://postgres@127.0.0.1:5432/test", ServerVersion: "15.20 (Debian)", CPUs: 2,
		Total: 8, Members: 4, ServiceMs: 10, DeadlineMs: 100, Load: 1.5, RatePerS: 1200, QueueWaitMs: 80, Rule: true,
		PhaseS: 3, WarmupS: 2, IntervalS: 1, PollMs: 5}
	tx := func(n int) *int { return &n }
	phase := func(name string, begin float64, good float64, most int) *fleetPhase {
		return &fleetPhase{Name: name, BeginS: begin, EndS: begin + 3, MembersFirst: 4, MembersMax: 4, MembersLast: 4,
			Succeeded: int64(good * 3), Arrived: 3600, GoodputPerS: good, OfferedPerS: 1200,
			SuccessMs: &cli.Pct{P50: 12, P95: 30, P99: 60}, FailureMs: &cli.Pct{P50: 0.1, P95: 0.2, P99: 0.4}, ServerMaxTx: tx(most), Polls: 600}
	}
	arm := func(name string, good float64, deployMost int) *fleetArm {
		a := &fleetArm{Name: name, Setup: "setup of " + name}
		for i, ph := range []string{phaseStart, phaseSteady, phaseDeploy, phaseKill, phaseScaleDown} {
			most := 8
			if ph == phaseDeploy {
				most = deployMost
			}
			p := phase(ph, float64(3*i), good, most)
			if ph == phaseDeploy {
				p.MembersFirst, p.MembersMax, p.MembersLast = 8, 8, 4
			}
			a.Phases = append(a.Phases, p)
			a.ServerTx = append(a.ServerTx, fleetPoint{T: float64(3*i) + 1, V: float64(most)})
		}
		a.Events = []*fleetEvent{{T: 0, Kind: "start", Members: []int{0, 1, 2, 3}, Live: 4, Phase: phaseStart},
			{T: 6, Kind: "start", Members: []int{4, 5, 6, 7}, Live: 8, Phase: phaseDeploy},
			{T: 9, Kind: "kill", Members: []int{4}, Live: 3, Phase: phaseKill}}
		return a
	}
	one := &fleetArm{Name: armOne, Setup: "one process", Phases: []*fleetPhase{phase(phaseStart, 0, 700, 8), phase(phaseSteady, 2, 760, 8)}}
	fleet := arm(armFleet, 740, 8)
	fleet.Policy = &cli.PolicyJSON{MaxConcurrent: 8, MaxQueue: 64}
	fleet.ShareSum = []fleetPoint{{0, 0}, {0.2, 8}, {6.5, 6}, {7.5, 8}, {15.5, 0}} // the last after the arm's end
	s1, s2 := 1.02, 1.95
	fleet.Events[0].SettleS, fleet.Events[1].SettleS, fleet.Events[2].WithinS = &s1, &s2, 3
	fleet.Phases[0].SettleMaxS, fleet.Phases[2].SettleMaxS, fleet.Phases[3].Unsettled = &s1, &s2, 1
	static8 := arm(armStatic8, 390, 8)
	static8.Policy = &cli.PolicyJSON{MaxConcurrent: 1, MaxQueue: 8}
	rep.Arms = []*fleetArm{one, arm(armStatic4, 750, 16), static8, fleet, arm(armPgBouncer, 650, 9)}
	return rep
}

func TestFleetTablePrintsEveryArmAndPhaseAndTheComparisons(t *testing.T) {
	var b bytes.Buffer
	cannedFleetReport().printTable(&b)
	out := b.String()
	clitest.WantCells(t, out,
		"fleet on postgres://postgres@127.0.0.1:5432/test (PostgreSQL 15.20), 2 CPUs",
		"T = 8; each request BEGIN; SELECT pg_sleep(10 ms); COMMIT with a deadline of 100 ms; T/S = 800/s; offered 1.5 × T/S = 1200/s",
		"arm phase members offered/s goodput/s ok p99 fail p99",
		"static4 deploy 8→4 1200 750 60.0 0.4 2250 0 0 0 0 16 - - -",
		"fleet start 4 1200 740", "1.02 s",
		"fleet kill 4 1200 740 60.0 0.4 2220 0 0 0 0 8 - > 3.00 s 0",
		"steady static4 0.99, static8 0.51, fleet 0.97, pgbouncer 0.86",
		"server transactions above T = 8: static4 deploy 16 (+8); pgbouncer deploy 9 (+1)",
		"server transactions within T = 8 in every phase: one, static8, fleet",
		"start #0-3 → 4 live: 1.02 s",
		"kill #4 → 3 live: not within 3.00 s",
	)
	if strings.Contains(out, "interrupted") {
		t.Errorf("an uninterrupted run says interrupted:\n%s", out)
	}
}

func TestFleetChartIsAWellFormedSVGWithEverySeriesAndTheLegendsOutside(t *testing.T) {
	rep := cannedFleetReport()
	c, err := layoutFleetChart(rep)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.times) != 4 || len(c.bars) != 2 || !slices.Equal(c.groups, comparedPhases) {
		t.Fatalf("%d time panels, %d bar panels, groups %v", len(c.times), len(c.bars), c.groups)
	}
	page := svg.Box{X: 0, Y: 0, W: c.w, H: c.h}
	check := func(title string, lay svg.Layout, legend []svg.LegendEntry) {
		used := svg.Box{X: lay.Legend.X, Y: lay.Legend.Y, W: svg.LegendWidth(legend), H: float64(len(legend)) * svg.LegendRowHeight}
		if used.Overlaps(lay.Plot) {
			t.Errorf("%s: legend %+v overlaps the plot area %+v", title, used, lay.Plot)
		}
		if used.Right() > lay.Outer.Right() || used.Bottom() > lay.Outer.Bottom() || !used.Overlaps(page) {
			t.Errorf("%s: legend %+v leaves its panel %+v", title, used, lay.Outer)
		}
		if lay.Plot.W < 600 || lay.Plot.H < 120 {
			t.Errorf("%s: plot area %+v too small", title, lay.Plot)
		}
	}
	for _, cell := range c.times {
		check(cell.title, cell.lay, cell.legend)
		if cell.band.Bottom() > cell.lay.Plot.Y || cell.band.Y < cell.lay.Outer.Y+svg.PanelTitleH-1 {
			t.Errorf("%s: the phase band %+v is not between the title and the plot %+v", cell.title, cell.band, cell.lay.Plot)
		}
	}
	for _, cell := range c.bars {
		check(cell.title, cell.lay, cell.legend)
	}
	path := filepath.Join(t.TempDir(), "fleet.svg")
	if err := writeFleetChart(path, rep); err != nil {
		t.Fatal(err)
	}
	doc := clitest.WantSVGFile(t, path, c.w, c.h)
	for _, want := range []string{
		"fleet (a fleet budget T=8 Q=64, interval 1s): the service's transactions on the server",
		"static8 (each member B=1 Q=8): the service's transactions on the server",
		"<!-- series: sum of the members' B -->", ">sum of the members&#39; B<",
		"<!-- event: kill #4 at 9.00 s -->", ">member killed (SIGKILL)<", "<!-- phase: scale-down -->",
		"<!-- bar: deploy static4 -->", "<!-- bar: scale-down pgbouncer -->",
		">one process, B=8: 760/s<", ">0.9 × that: 684/s<", ">T = 8<",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	// No line leaves its plot area: the shares' changes after the last
	// phase are not drawn.
	for _, m := range regexp.MustCompile(`<polyline points="([^"]*)"`).FindAllStringSubmatch(doc, -1) {
		for _, xy := range strings.Fields(m[1]) {
			var x, y float64
			fmt.Sscanf(xy, "%g,%g", &x, &y)
			if x > c.times[0].lay.Plot.Right()+0.01 {
				t.Errorf("a line reaches x=%g, right of the plot areas (%g)", x, c.times[0].lay.Plot.Right())
			}
		}
	}
	// In every time panel the server's series is drawn, over T (drawn
	// first, a band under the data) and, for the fleet, over the shares.
	for _, panel := range strings.Split(doc, "<!-- panel: ")[1:5] {
		ref, tx := strings.Index(panel, "<!-- reference: T = 8 -->"), strings.Index(panel, "<!-- series: server transactions -->")
		if ref < 0 || tx < ref {
			t.Errorf("panel %q: T at %d, server series at %d", panel[:30], ref, tx)
		}
		if sh := strings.Index(panel, "<!-- series: sum of the members' B -->"); strings.HasPrefix(panel, "fleet") && (sh < ref || sh > tx) {
			t.Errorf("fleet panel: shares at %d, want between T (%d) and the server series (%d)", sh, ref, tx)
		}
	}
	// A legend names what its panel draws: the shares in the fleet's
	// panel alone, the kinds of event that happened.
	for _, cell := range c.times {
		var names []string
		for _, e := range cell.legend {
			names = append(names, e.Name)
		}
		has := strings.Join(names, "|")
		if fleet := cell.arm.Name == armFleet; strings.Contains(has, "members' B") != fleet {
			t.Errorf("%s: legend %v", cell.arm.Name, names)
		}
		if !strings.Contains(has, "killed") || strings.Contains(has, "stopped") {
			t.Errorf("%s: legend %v, want the kill and the start, no stop", cell.arm.Name, names)
		}
	}
	// Nothing measured: no chart.
	if _, err := layoutFleetChart(&fleetReport{}); err == nil {
		t.Error("a chart of nothing")
	}
}

// fakeMemberDB stands for a member's database: its requests end at once,
// with an outcome set by their number.
type fakeMemberDB struct {
	calls  atomic.Int64
	closed atomic.Bool
}

func fakeOutcome(n int64) error {
	switch {
	case n%3 == 0:
		return &bulkhead.RejectedError{Cause: bulkhead.ErrAdmissionFull}
	case n%5 == 0:
		return context.DeadlineExceeded
	case n%7 == 0:
		return errors.New("boom")
	}
	return nil
}

func (f *fakeMemberDB) do(context.Context) error { return fakeOutcome(f.calls.Add(1)) }
func (f *fakeMemberDB) stats() (bulkhead.Stats, fleet.Stats, bool) {
	return bulkhead.Stats{MaxConcurrent: 3, MaxQueue: 5}, fleet.Stats{Instances: 2}, true
}
func (f *fakeMemberDB) close() error { f.closed.Store(true); return nil }

func TestFleetMemberSpeaksTheProtocol(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := &fakeMemberDB{}
	open := func(_ context.Context, cfg *memberConfig, onChange func(fleet.Event)) (memberDB, error) {
		if cfg.Arm != armFleet || cfg.App != "svc" {
			return nil, fmt.Errorf("configuration %+v", cfg)
		}
		onChange(fleet.Event{Fleet: "f", Instances: 2, MaxConcurrent: 3, MaxQueue: 5})
		return db, nil
	}
	in, w := io.Pipe()
	var out syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- runMember(ctx, in, &out, open) }()
	send := func(v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if _, err := w.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
	}
	// waitCalls waits until the member ran at least n requests.
	waitCalls := func(n int64) {
		t.Helper()
		for db.calls.Load() < n {
			select {
			case <-ctx.Done():
				t.Fatalf("%d requests ran, want %d", db.calls.Load(), n)
			case <-time.After(time.Millisecond):
			}
		}
	}
	send(memberConfig{Arm: armFleet, App: "svc", Deadline: time.Second, Rate: 5000, Report: 5 * time.Millisecond, Phase: 2})
	waitCalls(30)
	send(map[string]any{"phase": 3})
	waitCalls(db.calls.Load() + 30)
	zero := 0.0
	send(memberCommand{Rate: &zero})
	w.Write([]byte("not a command\n")) // ignored
	w.Close()                          // the end of input: a graceful stop
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !db.closed.Load() {
		t.Error("the member did not close its database")
	}
	var msgs []memberMsg
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		var m memberMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		msgs = append(msgs, m)
	}
	if len(msgs) < 4 || msgs[0].Type != msgShare || msgs[1].Type != msgReady || msgs[len(msgs)-1].Type != msgBye {
		t.Fatalf("messages %+v: want share, ready, reports, bye", msgs)
	}
	if s := msgs[0]; s.B != 3 || s.Q != 5 || s.Instances != 2 || s.Phase != 2 {
		t.Errorf("share %+v", s)
	}
	// Every request is in exactly one report, with its outcome, tagged
	// with the phase it ended in.
	var n [moOther + 1]int64
	phases := map[int]bool{}
	for _, m := range msgs[2 : len(msgs)-1] {
		if m.Type != msgReport {
			t.Fatalf("%+v between ready and bye", m)
		}
		phases[m.Phase] = true
		if m.B != 3 || m.Instances != 2 {
			t.Errorf("report without the gate's state: %+v", m)
		}
		for i, c := range []int64{m.OK, m.Late, m.Full, m.Timeout, m.Deadline, m.Other} {
			n[i] += c
		}
		if int64(len(m.OKUs)) != m.OK || int64(len(m.FailUs)) != m.Full+m.Deadline+m.Other {
			t.Errorf("report %+v: times do not match the counts", m)
		}
	}
	var want [moOther + 1]int64
	for i := int64(1); i <= db.calls.Load(); i++ {
		err := fakeOutcome(i)
		want[classifyMember(err, 0, time.Second, context.Background())]++
	}
	if n != want || !phases[2] || !phases[3] {
		t.Errorf("outcomes %v in phases %v, want %v in phases 2 and 3", n, phases, want)
	}

	// A configuration it cannot read: an error line, and an error.
	var bad syncbuf.Buffer
	if err := runMember(ctx, strings.NewReader("{nope\n"), &bad, open); err == nil || !strings.Contains(bad.String(), `"type":"error"`) {
		t.Errorf("bad configuration: %v, output %q", err, bad.String())
	}
}

// The experiment on PostgreSQL, shortened: the fleet arm with two
// members (this test binary, started again as fleet-member), very short
// phases. It asserts what the schedule makes happen, not how fast: the
// deadline is generous, so that requests succeed on a busy machine too.
func TestFleetOnPostgreSQLStartsStopsAndKillsMembersAndKeepsTheFleetWithinT(t *testing.T) {
	dsn := clitest.PostgresURL(t)
	dir := t.TempDir()
	jsonPath, chartPath := filepath.Join(dir, "fleet.json"), filepath.Join(dir, "fleet.svg")
	const total = 4
	r := runCmd(t, nil, "fleet", "--dsn", dsn, "--arms", "fleet", "--members", "2", "--max-concurrent", "4",
		"--service", "20ms", "--deadline", "2s", "--load", "1", "--phase", "600ms", "--warmup", "600ms",
		"--fleet-interval", "300ms", "--fleet-fallback", "0", "--poll", "2ms", "--json", jsonPath, "--chart", chartPath)
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d\nstderr:\n%s\nstdout:\n%s", r.Code, r.Stderr, r.Stdout)
	}
	rep := clitest.ReadJSON[fleetReport](t, jsonPath)
	if len(rep.Arms) != 1 || rep.Arms[0].Name != armFleet || rep.Interrupted {
		t.Fatalf("arms %+v, interrupted %v", rep.Arms, rep.Interrupted)
	}
	a := rep.Arms[0]
	var names []string
	for _, p := range a.Phases {
		names = append(names, p.Name)
	}
	if !slices.Equal(names, []string{phaseStart, phaseSteady, phaseDeploy, phaseKill, phaseScaleDown}) {
		t.Fatalf("phases %v", names)
	}
	// Two start, two more in the deploy, the first two stop, the third is
	// killed; the fourth stops at the end.
	var kinds []string
	for _, ev := range a.Events {
		kinds = append(kinds, fmt.Sprintf("%s %s %d", ev.Kind, memberList(ev.Members), ev.Live))
	}
	if got, want := strings.Join(kinds, ", "), "start #0-1 2, start #2-3 4, stop #0 3, stop #1 2, kill #2 1"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
	if len(a.Members) != 4 {
		t.Fatalf("%d members, want 4", len(a.Members))
	}
	for _, m := range a.Members {
		killed := m.Index == 2
		if m.Pid == 0 || m.Reports == 0 || m.ReadyS == nil || (m.KillS != nil) != killed || (m.StopS != nil) == killed {
			t.Errorf("member %+v", m)
		}
		if want := "exited"; killed && m.Exit != "killed (SIGKILL)" || !killed && m.Exit != want {
			t.Errorf("member %d ended %q", m.Index, m.Exit)
		}
	}
	// A coordination round may fail on a loaded machine (its dial is
	// bounded by the interval): with a fallback of 0 that lowers a share,
	// never the bound. Anything else is an error.
	for _, e := range a.Errors {
		if !strings.Contains(e, "fleet round failed") {
			t.Errorf("error: %s", e)
		}
	}
	if a.PollError != "" {
		t.Errorf("poll error %q", a.PollError)
	}
	succeeded := int64(0)
	for _, p := range a.Phases {
		succeeded += p.Succeeded
		if p.ServerMaxTx == nil || p.Polls == 0 {
			t.Fatalf("%s: no poll of the server", p.Name)
		}
		// Within T, but after the SIGKILL: the killed member's last
		// transactions may still run on the server (a backend notices
		// its client is gone only when it next talks to it) after its
		// coordination session ended and the survivor took its slots:
		// at most its share more.
		limit := total
		if p.Name == phaseKill {
			limit += total / 2
		}
		if *p.ServerMaxTx > limit {
			t.Errorf("%s: %d transactions of the service on the server at once, want at most %d", p.Name, *p.ServerMaxTx, limit)
		}
	}
	if succeeded == 0 {
		t.Error("no request succeeded")
	}
	clitest.WantCells(t, r.Stdout, "fleet start 0→2", "fleet shares settled after each event", "chart written to "+chartPath)
	if svg := clitest.ReadFile(t, chartPath); !strings.Contains(svg, "<!-- series: sum of the members' B -->") {
		t.Error("the chart lacks the fleet's shares")
	}
}

func ptr[T any](v T) *T { return &v }

func TestFleetMemberCountsARequestInThePhaseItArrivedIn(t *testing.T) {
	rec := &memberRec{phase: 0}
	rec.add(0, moOK, 10*time.Millisecond, nil)
	ms := rec.cut(100, 1) // the mark of phase 1
	if len(ms) != 1 || ms[0].Phase != 0 || ms[0].OK != 1 || ms[0].From != 0 || ms[0].T != 100 {
		t.Fatalf("first cut %+v", ms)
	}
	// A request of phase 0 ends after the mark: it still counts in 0.
	rec.add(0, moTimeout, 400*time.Millisecond, nil)
	rec.add(1, moOK, 20*time.Millisecond, nil)
	rec.add(1, moOther, time.Millisecond, errors.New("boom"))
	ms = rec.cut(200, 1)
	if len(ms) != 2 || ms[0].Phase != 0 || ms[0].Timeout != 1 || ms[1].Phase != 1 || ms[1].OK != 1 || ms[1].Other != 1 || ms[1].Errors["boom"] != 1 || ms[1].From != 100 {
		t.Fatalf("second cut %+v", ms)
	}
	// Nothing ended: one empty report, of the current phase.
	if ms = rec.cut(300, 2); len(ms) != 1 || ms[0].Phase != 1 || ms[0].OK+ms[0].Other != 0 {
		t.Fatalf("empty cut %+v", ms)
	}
}
