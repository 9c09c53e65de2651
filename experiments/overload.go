package main

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
)

const overloadUsage = `Usage: experiments overload [--dsn URL] [--loads 1,3,6] [--duration D] [--shape NAME,...] [flags]

The open-loop overload experiment. Requests arrive at random (Poisson
arrivals) at a fixed rate, each in its own goroutine with its own deadline
(--deadline), whatever happened to the ones before: unlike the clients of
"bulkhead load", nobody slows down when the database does. Each request is
a transaction of the shape --shape names (default cpu: one CPU-bound query,
--cpu-rows; on PostgreSQL SELECT sum(i) FROM generate_series(1, N) i).

First it measures the unloaded service time S (one worker, transactions
back to back) and the capacity C (transactions per second that
--capacity-workers workers, back to back, get through). Then, for each load
in --loads (multiples of C), it offers that rate for --warmup (not counted)
plus --duration to each configuration in turn, with the same arrivals:

  plain      database/sql, pool unlimited (MaxIdleConns B+Q)
  semaphore  database/sql, MaxOpenConns B: the pool as a semaphore
  waitfirst  the bulkhead most libraries offer (failsafe-go's): B permits
             waited for in FIFO order for the gate's queue wait, with no
             bound on the queue, before a connection is taken from a
             database/sql pool of B
  fsbulkhead failsafe-go's bulkhead: B permits waited for at most the
             gate's queue wait, before a connection is taken from a
             database/sql pool of B (B, not the best of --sweep)
  fsadaptive failsafe-go's adaptive limiter, limits 1 to the ceiling
             (--ceiling), starting at 4, queueing with rejection factors 2
             and 3, around a plain database/sql pool
  fsadaptive-wait  the same with a max wait equal to the gate's queue wait
  gate       bulkhead B, Q and the queue wait, through g.OpenDB()
  static     the gate at each B of --sweep (default 1,2,4,8,16), as
             static-1, static-2, ...: Q and the wait by the rule below for
             that B unless given. Per load, the one of most goodput is the
             best static B: the summary divides every goodput by it
  adaptive   bulkhead with Policy.Adaptive: B found between 1 and the
             ceiling (--ceiling, default B), Q 4 times the ceiling, the
             queue wait the deadline: nothing computed from C

With --shape NAME[,NAME...] (default cpu) each request is of that shape;
with several, the whole experiment (S, C, every load) runs once per shape,
one table each, then a summary of them all. N is --cpu-rows (scaled to S
with --service), S the --service time (without it, the cpu query's
unloaded time, measured first); all but cpu need PostgreSQL, and create
their tables (bulkhead_shape_*, a few rows) if missing:

  cpu         a transaction running SELECT sum(i) FROM generate_series(1, N) i
  sleep       a transaction running SELECT pg_sleep(S): I/O-bound, no CPU
              on the server
  mix         90% cpu's; 10% a report query over 30·N rows (another text),
              whose deadline is 30 × --deadline
  outlier     cpu's, and once in each --outlier-every of arrivals (at an
              offset drawn from the seed) a SELECT pg_sleep(1000·S), at most
              --outlier-max, whose deadline is its sleep plus --deadline
  lock        cpu's query also reading the table bulkhead_shape_lock; a
              session of its own (no pool, no gate) holds the table in
              ACCESS EXCLUSIVE mode for --lock-hold from a quarter into the
              counted duration. Reported: goodput of the requests arriving
              in the second after the release, and when the first of those
              committed in time
  hotrow      UPDATE bulkhead_shape_hot SET n = n + 1 WHERE id = 1, then a
              CPU-bound query over N/4 rows, then COMMIT: lock-bound
  roundtrips  one of 5 kinds of transaction, drawn from the seed: 6 or 10
              primary-key SELECTs (read-only), or 8 to 12 SELECTs then 4 to
              10 UPDATEs in id order, on two tables of 100 rows: about 15
              round trips each; --service and --cpu-rows do not change it

With --cold each phase starts with no connection dialed (every phase has a
new gate anyway): goodput by arrival per 250 ms from its first arrival,
the first second's, and when it first reached 0.9 of the phase's counted
goodput are reported (the first second is counted only with --warmup 0s).
Every phase also reports its dials per second during the counted duration
(Connect calls on the driver's connector, pools included).

With --high F each arrival is, at random (seeded), a high-priority request
with probability F: the gate configurations tag those with workload
"high" (Priority 1) and the others with "low" (Priority 0), each with the
policy's B, Q and wait; the configuration "alone" is the gate offered the
high-priority arrivals alone. Each configuration's goodput of high-priority
requests is reported, and compared with alone's.

With --shift F (--shape cpu only) the work of each request is multiplied
by F for the second half of the counted duration (the database slows
down); C after the shift is measured too, and each configuration's goodput
is reported before and after the shift and over time (--chart draws it).

With --service (e.g. 5ms,10ms,20ms) the whole experiment runs once per
service time: --cpu-rows is first scaled until the unloaded service time
of the cpu query is within 5% of it. One table is printed per service
time (and shape), and the chart puts them one above the other.

With --rounds N each load's configurations run N times, each round
starting with the next configuration, so that a drift in the machine's
speed hits them alike; the table and the chart show, for each
configuration, the round of median goodput, and the ratios add each
round's.

B defaults to the number of CPUs. Unless given, the queue wait and Q follow
from the deadline D and s = B/C, the time a transaction takes when B run
at once (the rule BENCHMARKS.md measures):

  wait = D − 2·s          a request that waited that long still commits in time
  Q    = max(B, ⌊C·wait⌋)  the queue drains within the wait at capacity

For each load and configuration it reports the goodput (transactions
committed within their deadline, per second), the p50 and p99 latency of
successes, the p99 time for a failure to come back, failures by cause,
dials per second and, on PostgreSQL, the most transactions and connections
the server showed for it (pg_stat_activity by application_name;
transactions counted only if they began before the poll's statement did).
Against a local server the client takes CPU from it: say so with the
figures. The unlimited pool opens a connection for every request in
flight and may reach the server's max_connections: use a server nobody
else depends on. Ctrl-C stops the run and reports what was measured.
`

const overloadExamples = `  experiments overload --dsn postgres://postgres@127.0.0.1:5432/test --chart docs/overload.svg
  experiments overload --dsn postgres://postgres@127.0.0.1:5432/test --loads 3 --duration 3s \
      --max-concurrent 2 --max-queue 20 --queue-wait 80ms --json -
  experiments overload --capacity 200 --loads 1,2 --duration 1s --cpu-rows 2000
  experiments overload --dsn postgres://postgres@127.0.0.1:5432/test --service 10ms --shape sleep,hotrow \
      --configs static,adaptive --sweep 1,2,4,8,16 --ceiling 16 --loads 1,3 --duration 5s
  experiments overload --dsn postgres://postgres@127.0.0.1:5432/test --shape lock --lock-hold 2s \
      --configs gate,adaptive --ceiling 16 --duration 8s --cold --warmup 0s
`

// The configurations of the experiment, in the order they run.
const (
	cfgPlain          = "plain"
	cfgSemaphore      = "semaphore"
	cfgWaitFirst      = "waitfirst"
	cfgFsBulkhead     = "fsbulkhead"
	cfgFsAdaptive     = "fsadaptive"
	cfgFsAdaptiveWait = "fsadaptive-wait"
	cfgGate           = "gate"
	cfgStatic         = "static" // one configuration per B of --sweep, named staticName(B)
	cfgAdaptive       = "adaptive"
	cfgAlone          = "alone"
)

var overloadConfigs = []string{cfgPlain, cfgSemaphore, cfgWaitFirst, cfgFsBulkhead, cfgFsAdaptive, cfgFsAdaptiveWait, cfgGate, cfgStatic, cfgAdaptive, cfgAlone}

// staticName names the static configuration of B b.
func staticName(b int) string { return cfgStatic + "-" + strconv.Itoa(b) }

// staticB returns the B of a static configuration's name.
func staticB(name string) (int, bool) {
	v, ok := strings.CutPrefix(name, cfgStatic+"-")
	if !ok {
		return 0, false
	}
	b, err := strconv.Atoi(v)
	return b, err == nil
}

// timelineStep is the width of the buckets of goodput over time.
const timelineStep = 250 * time.Millisecond

// runSeq numbers the runs of a process: their application_name.
var runSeq atomic.Int64

// Limits of the overload flags.
const (
	maxOverloadRate  = 100_000 // requests per second
	overloadPoll     = 20 * time.Millisecond
	drainLimit       = 5 * time.Second // wait for the server to finish a phase's work
	maxOverloadLoads = 20
)

// overloadConfig is a validated overload command line.
type overloadConfig struct {
	target       *cli.Target
	loads        []float64 // multiples of C
	configs      []string
	duration     time.Duration // counted, per load and configuration
	warmup       time.Duration // before it, not counted
	deadline     time.Duration
	cpuRows      int
	capacity     float64 // 0: measure
	capWorkers   int     // 0: B
	capDuration  time.Duration
	b, q         int           // q < 0: by the rule
	wait         time.Duration // < 0: by the rule
	dryRun       bool
	workloads    map[string]bulkhead.Workload
	workload     string          // the workload the gate's requests name, if any
	policySource string          // where B, Q and the wait came from, for errors
	services     []time.Duration // S to scale cpuRows to, one run each; none: cpuRows as given
	rounds       int             // each load's configurations run this many times
	shift        float64         // the work is multiplied by it halfway through the counted duration; 0: no shift
	ceiling      int             // the adaptive configurations' ceiling
	high         float64         // the share of high-priority arrivals; 0: no priorities
	shapes       []string        // --shape: one run each
	sweep        []int           // the static configuration's B values, ascending
	cold         bool            // phases start with no connection dialed
	lockHold     time.Duration   // the lock shape's hold
	outlierEvery time.Duration   // the outlier shape's period, in arrival time
	outlierMax   time.Duration   // the outlier shape's longest sleep
	seed         uint64
	out          cli.Outputs

	// Set per run by runOverloads.
	shape string
	unit  unit
}

// runConfigs returns the configurations a load runs, in order: static is
// one per B of the sweep.
func (cfg *overloadConfig) runConfigs() []string {
	var out []string
	for _, c := range cfg.configs {
		if c != cfgStatic {
			out = append(out, c)
			continue
		}
		for _, b := range cfg.sweep {
			out = append(out, staticName(b))
		}
	}
	return out
}

func (e *env) overload(ctx context.Context, args []string) int {
	cfg, code, done := e.parseOverload(args)
	if done {
		return code
	}
	reps, err := e.runOverloads(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil && len(reps) == 0 {
			fmt.Fprintln(e.Stderr, "bulkhead: overload: interrupted before anything was measured")
			return cli.ExitInterrupted
		}
		if ctx.Err() == nil {
			return e.Fail(fmt.Errorf("overload: %w", err))
		}
	}
	measured := slices.ContainsFunc(reps, func(rep *overloadReport) bool { return len(rep.Phases) > 0 })
	table := func(w io.Writer) {
		for _, rep := range reps {
			rep.printTable(w)
		}
		if len(cfg.shapes) > 1 || slices.Contains(cfg.configs, cfgStatic) {
			printSummary(w, reps)
		}
	}
	chart := func(path string) error { return writeOverloadChart(path, reps) }
	var v any = reps
	if len(cfg.services) == 0 && len(cfg.shapes) == 1 && len(reps) == 1 {
		v = reps[0] // one run: the report itself, as before --service and --shape
	}
	return e.Report(ctx, "overload", cfg.out, measured, table, chart, v)
}

// runOverloads runs the experiment once per shape, or once per --service
// and shape with --cpu-rows scaled to it, and returns the reports
// measured, also when interrupted.
func (e *env) runOverloads(ctx context.Context, cfg *overloadConfig) ([]*overloadReport, error) {
	services := cfg.services
	if len(services) == 0 {
		services = []time.Duration{0} // --cpu-rows as given
	}
	var reps []*overloadReport
	rows := cfg.cpuRows
	for i, want := range services {
		u := unit{rows: rows, s: want}
		app := fmt.Sprintf("bh-overload-%d-calibrate-%d", os.Getpid(), i)
		var err error
		switch {
		case want > 0:
			fmt.Fprintf(e.Stderr, "overload: scaling --cpu-rows to S = %v\n", want)
			if rows, err = calibrateRows(ctx, cfg, want, rows, app); err != nil {
				return reps, err
			}
			u.rows = rows
		case slices.Contains(cfg.shapes, shapeSleep) || slices.Contains(cfg.shapes, shapeOutlier):
			fmt.Fprintf(e.Stderr, "overload: measuring the cpu query's unloaded time, the sleeps' S\n")
			if u.s, err = unitTime(ctx, cfg, rows, app); err != nil {
				return reps, err
			}
		}
		for _, name := range cfg.shapes {
			c := *cfg
			c.cpuRows, c.shape, c.unit = u.rows, name, u
			rep, err := e.runOverload(ctx, &c)
			if err != nil {
				return reps, err
			}
			if want > 0 {
				rep.ServiceTargetMs = cli.Ms(want)
			}
			reps = append(reps, rep)
			if rep.Interrupted {
				return reps, nil
			}
		}
	}
	return reps, nil
}

// unitTime returns the unloaded service time (p50, one worker back to
// back on plain database/sql) of the cpu query over rows.
func unitTime(ctx context.Context, cfg *overloadConfig, rows int, app string) (time.Duration, error) {
	lats, _, err := closedLoop(ctx, cfg, cli.Operation(cfg.target, "cpu", 0, rows), app, 1, max(300*time.Millisecond, cfg.capDuration/3))
	if err != nil {
		return 0, err
	}
	p := cli.Percentiles(lats)
	if p == nil {
		return 0, errors.New("no cpu query committed while measuring its unloaded time")
	}
	return time.Duration(p.P50 * float64(time.Millisecond)), nil
}

func (e *env) parseOverload(args []string) (*overloadConfig, int, bool) {
	fs := e.NewFlagSet("overload", overloadUsage, overloadExamples)
	dsn := fs.String("dsn", "", "database URL: postgres://... or mysql://...")
	loads := fs.String("loads", "1,3,6", "offered loads, as multiples of the capacity C, comma-separated")
	configs := fs.String("configs", "plain,semaphore,waitfirst,gate", "configurations to run, comma-separated: "+strings.Join(overloadConfigs, ", "))
	duration := fs.Duration("duration", 5*time.Second, "how long requests are counted, per load and configuration")
	warmup := fs.Duration("warmup", time.Second, "how long requests arrive before they are counted")
	deadline := fs.Duration("deadline", 100*time.Millisecond, "deadline of each request, from its start")
	cpuRows := fs.Int("cpu-rows", 70000, "rows each request's query sums (generate_series on PostgreSQL): N, the unit of the CPU-bound shapes")
	rounds := fs.Int("rounds", 1, "run each load's configurations this many times, starting each round with the next configuration, and report the round of median goodput")
	services := fs.String("service", "", "unloaded service times S to run the experiment at, comma-separated (e.g. 5ms,10ms,20ms): --cpu-rows is scaled to each (default: --cpu-rows as given)")
	capacity := fs.Float64("capacity", 0, "capacity C in transactions per second (0: measure it)")
	capWorkers := fs.Int("capacity-workers", 0, "workers, back to back, that measure C (0: B)")
	capDuration := fs.Duration("capacity-duration", 3*time.Second, "how long C is measured (S: a third of it)")
	workload := fs.String("workload", "", "tag the gate's requests with this workload of the policy (--workloads)")
	shift := fs.Float64("shift", 0, "multiply the work by this (e.g. 3) halfway through the counted duration, --shape cpu only (0: no shift)")
	high := fs.Float64("high", 0, "the share of arrivals that are high-priority requests, e.g. 0.2 (0: no priorities)")
	ceiling := fs.Int("ceiling", 0, "the ceiling of the adaptive configurations (adaptive, fsadaptive; 0: B)")
	shapes := fs.String("shape", shapeCPU, "the shapes of the requests, comma-separated, the whole experiment once each: "+strings.Join(overloadShapes, ", "))
	sweep := fs.String("sweep", "1,2,4,8,16", "the B of each static configuration, comma-separated (--configs static)")
	cold := fs.Bool("cold", false, "start each phase with no connection dialed, and report its goodput from its first arrival")
	lockHold := fs.Duration("lock-hold", 3*time.Second, "how long the lock shape's session holds its table, from a quarter into the counted duration")
	outlierEvery := fs.Duration("outlier-every", 3*time.Second, "the outlier shape's: one outlier in each window of arrivals this long")
	outlierMax := fs.Duration("outlier-max", 2*time.Second, "the outlier shape's: the longest an outlier sleeps (else 1000·S)")
	pi := e.AddPolicyFlags(fs)
	seed := fs.Uint64("seed", 1, "seed of the arrival times and of the shapes' draws: the same for every configuration")
	out := cli.AddOutputFlags(fs, "the results")
	set, code, done := e.Parse(fs, args)
	if done {
		return nil, code, true
	}
	bad := cli.Failer[overloadConfig](e.Env, "overload")
	cfg := &overloadConfig{
		duration: *duration, warmup: *warmup, deadline: *deadline, cpuRows: *cpuRows, rounds: *rounds,
		capacity: *capacity, capWorkers: *capWorkers, capDuration: *capDuration,
		seed: *seed, out: *out, shift: *shift, ceiling: *ceiling, high: *high,
		cold: *cold, lockHold: *lockHold, outlierEvery: *outlierEvery, outlierMax: *outlierMax,
	}
	var err error
	if cfg.loads, err = parseLoads(*loads); err != nil {
		return bad("--loads %q: %v", *loads, err)
	}
	if cfg.configs, err = parseConfigs(*configs); err != nil {
		return bad("--configs %q: %v", *configs, err)
	}
	if cfg.shapes, err = parseSubset(*shapes, overloadShapes, "a shape"); err != nil {
		return bad("--shape %q: %v", *shapes, err)
	}
	if cfg.sweep, err = parseSweep(*sweep, cli.MaxClients); err != nil {
		return bad("--sweep %q: %v", *sweep, err)
	}
	if cfg.services, err = parseServices(*services, *deadline); err != nil {
		return bad("--service %q: %v", *services, err)
	}
	if len(cfg.services) > 0 && cli.FlagsSet(fs)["cpu-rows"] {
		return bad("--cpu-rows %d does nothing with --service %s: the rows are scaled to each service time; want one or the other", *cpuRows, *services)
	}
	switch {
	case cfg.duration <= 0 || cfg.duration > time.Hour:
		return bad("--duration is %v, want more than 0s and at most 1h0m0s", cfg.duration)
	case cfg.warmup < 0 || cfg.warmup > time.Hour:
		return bad("--warmup is %v, want 0s to 1h0m0s", cfg.warmup)
	case cfg.deadline <= 0 || cfg.deadline > time.Hour:
		return bad("--deadline is %v, want more than 0s and at most 1h0m0s", cfg.deadline)
	case cfg.shift != 0 && !(cfg.shift >= 0.1 && cfg.shift <= 100):
		return bad("--shift is %v, want 0 (none) or 0.1 to 100", cfg.shift)
	case cfg.high < 0 || cfg.high >= 1 || math.IsNaN(cfg.high):
		return bad("--high is %v, want 0 (no priorities) to below 1", cfg.high)
	case cfg.high > 0 && (*workload != "" || set[cli.SetWorkloads]):
		return bad("--high %v names the workloads high and low itself; want no --workload or --workloads with it", cfg.high)
	case cfg.high == 0 && slices.Contains(cfg.configs, cfgAlone):
		return bad("--configs %s: alone is the gate offered the high-priority arrivals alone; want --high too", *configs)
	case cfg.ceiling < 0 || cfg.ceiling > cli.MaxClients:
		return bad("--ceiling is %d, want 0 (B) to %d", cfg.ceiling, cli.MaxClients)
	case cfg.rounds < 1 || cfg.rounds > 9:
		return bad("--rounds is %d, want 1 to 9", cfg.rounds)
	case cfg.cpuRows < 1 || cfg.cpuRows > 1_000_000_000:
		return bad("--cpu-rows is %d, want 1 to 1000000000", cfg.cpuRows)
	case cfg.capacity < 0 || cfg.capacity > maxOverloadRate || math.IsNaN(cfg.capacity):
		return bad("--capacity is %v, want 0 (measure) to %d per second", cfg.capacity, maxOverloadRate)
	case cfg.capWorkers < 0 || cfg.capWorkers > cli.MaxClients:
		return bad("--capacity-workers is %d, want 0 (B) to %d", cfg.capWorkers, cli.MaxClients)
	case cfg.capDuration <= 0 || cfg.capDuration > time.Hour:
		return bad("--capacity-duration is %v, want more than 0s and at most 1h0m0s", cfg.capDuration)
	case set["capacity-workers"] && cfg.capacity > 0:
		return bad("--capacity-workers %d does nothing with --capacity %v: the capacity is given, not measured; want one or the other", cfg.capWorkers, cfg.capacity)
	case set["sweep"] && !slices.Contains(cfg.configs, cfgStatic):
		return bad("--sweep %s does nothing without the static configuration (--configs %s); want static in --configs, or no --sweep", *sweep, *configs)
	case cfg.shift != 0 && !slices.Equal(cfg.shapes, []string{shapeCPU}):
		return bad("--shift %v multiplies the cpu query's rows; want --shape cpu alone with it, not %s", cfg.shift, *shapes)
	}
	// The shapes' own flags.
	for _, f := range []struct {
		name, shape string
		v, most     time.Duration
	}{
		{"lock-hold", shapeLock, cfg.lockHold, time.Hour},
		{"outlier-every", shapeOutlier, cfg.outlierEvery, time.Hour},
		{"outlier-max", shapeOutlier, cfg.outlierMax, maxOutlierSleep},
	} {
		switch {
		case set[f.name] && !slices.Contains(cfg.shapes, f.shape):
			return bad("--%s does nothing without the %s shape (--shape %s); want %s in --shape, or no --%s", f.name, f.shape, *shapes, f.shape, f.name)
		case f.v <= 0 || f.v > f.most:
			return bad("--%s is %v, want more than 0s and at most %v", f.name, f.v, f.most)
		}
	}
	if at := lockAt(cfg.duration); slices.Contains(cfg.shapes, shapeLock) && at+cfg.lockHold >= cfg.duration {
		return bad("--lock-hold is %v, want it to end within --duration %v: the lock is taken %v into it; want a hold below %v, or a longer --duration",
			cfg.lockHold, cfg.duration, at, cfg.duration-at)
	}
	// The gate's settings do nothing unless the gate runs (the queue
	// wait is also waitfirst's).
	if !slices.Contains(cfg.configs, cfgGate) {
		for _, name := range []string{cli.SetWait, cli.SetDryRun, cli.SetWorkloads, "workload"} {
			if name == cli.SetWait && (slices.Contains(cfg.configs, cfgWaitFirst) || slices.Contains(cfg.configs, cfgStatic)) {
				continue
			}
			if set[name] {
				return bad("--%s does nothing without the gate configuration (--configs %s); want gate in --configs, or no --%s", name, *configs, name)
			}
		}
	}
	r, err := pi.Resolve(set, bulkhead.Policy{MaxConcurrent: numCPU()})
	if err == nil {
		err = cli.CheckWorkload(r, *workload, set)
	}
	if err != nil {
		return bad("%w", err)
	}
	cfg.b, cfg.q, cfg.wait = r.P.MaxConcurrent, -1, -1
	if r.Given(cli.SetQ) {
		cfg.q = r.P.MaxQueue
	}
	if r.Given(cli.SetWait) {
		cfg.wait = r.P.QueueWait
	}
	cfg.dryRun, cfg.workloads, cfg.workload = r.P.DryRun, r.P.Workloads, *workload
	cfg.policySource = fmt.Sprintf("B %s, Q %s, wait %s", r.Describe(cli.SetB), r.Describe(cli.SetQ), r.Describe(cli.SetWait))
	switch {
	case cfg.b > cli.MaxClients:
		return bad("B is %d (%s), want 1 to %d", cfg.b, r.Describe(cli.SetB), cli.MaxClients)
	case cfg.q > cli.MaxClients:
		return bad("Q is %d (%s), want 0 to %d", cfg.q, r.Describe(cli.SetQ), cli.MaxClients)
	}
	if r.Given(cli.SetQ) && r.Given(cli.SetWait) {
		if err := r.Check(); err != nil {
			return bad("%w", err)
		}
	}
	if cfg.capWorkers == 0 {
		cfg.capWorkers = cfg.b
	}
	if cfg.ceiling == 0 {
		cfg.ceiling = cfg.b
	}
	if err := cfg.out.Check(); err != nil {
		return bad("%w", err)
	}
	t, err := e.ResolveTarget(*dsn, set["dsn"])
	if err != nil {
		return bad("%w", err)
	}
	for _, name := range cfg.shapes {
		if name != shapeCPU && t.Dialect != cli.DialectPostgres {
			return bad("--shape %s needs PostgreSQL, not %s (%s); want --dsn postgres://..., or --shape cpu", name, t.Dialect.Title(), t.Display)
		}
	}
	cfg.target = t
	return cfg, cli.ExitOK, false
}

// parseLoads parses "1,3,6": each a multiple of the capacity, more than 0
// and at most 1000.
func parseLoads(s string) ([]float64, error) {
	var loads []float64
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v > 0 && v <= 1000) {
			return nil, fmt.Errorf("%q is not a load; want multiples of C from more than 0 to 1000, such as 1,3,6", f)
		}
		loads = append(loads, v)
	}
	if len(loads) > maxOverloadLoads {
		return nil, fmt.Errorf("%d loads, want at most %d", len(loads), maxOverloadLoads)
	}
	return loads, nil
}

// parseConfigs parses "plain,gate": configurations, each once, run in the
// experiment's order whatever the order given.
func parseConfigs(s string) ([]string, error) {
	return parseSubset(s, overloadConfigs, "a configuration")
}

// parseSubset parses a comma-separated subset of all, each once, and
// returns it in all's order whatever the order given; what names an
// element for the error.
func parseSubset(s string, all []string, what string) ([]string, error) {
	seen := map[string]bool{}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(all, f) {
			return nil, fmt.Errorf("%q is not %s; want %s or %s", f, what, strings.Join(all[:len(all)-1], ", "), all[len(all)-1])
		}
		seen[f] = true
	}
	var out []string
	for _, c := range all {
		if seen[c] {
			out = append(out, c)
		}
	}
	return out, nil
}

// maxServices bounds --service: each runs the whole experiment.
const maxServices = 5

// parseServices parses --service: distinct durations, each below the
// deadline.
func parseServices(s string, deadline time.Duration) ([]time.Duration, error) {
	if s == "" {
		return nil, nil
	}
	var out []time.Duration
	for f := range strings.SplitSeq(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		switch {
		case err != nil:
			return nil, fmt.Errorf("%q is not a duration; want durations such as 5ms,10ms,20ms", f)
		case d < 100*time.Microsecond || d >= deadline:
			return nil, fmt.Errorf("%v is out of range; want 100µs or more and below the deadline (%v)", d, deadline)
		case slices.Contains(out, d):
			return nil, fmt.Errorf("%v is given twice", d)
		}
		out = append(out, d)
	}
	if len(out) > maxServices {
		return nil, fmt.Errorf("%d service times, want at most %d", len(out), maxServices)
	}
	return out, nil
}

// calibrateRows returns the --cpu-rows that make the unloaded service
// time S (p50, one worker back to back on plain database/sql) within 5%
// of want, starting from rows: S grows linearly with the rows summed.
func calibrateRows(ctx context.Context, cfg *overloadConfig, want time.Duration, rows int, app string) (int, error) {
	for range 8 {
		op := cli.Operation(cfg.target, "cpu", 0, rows)
		lats, _, err := closedLoop(ctx, cfg, op, app, 1, max(time.Second, 50*want))
		if err != nil {
			return 0, err
		}
		got := cli.Percentiles(lats).P50 // ms
		r := float64(want) / float64(time.Millisecond) / got
		if r > 0.95 && r < 1.05 {
			return rows, nil
		}
		rows = int(math.Min(1e9, math.Max(1, float64(rows)*r)))
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	return rows, nil
}

// queueRule returns the gate's queue wait and Q for a deadline D, B and a
// capacity C (transactions per second). s = B/C is the time a transaction
// takes when B run at once. A request that waited wait = D − 2s still
// commits within D with a service time up to twice s. The queue holds
// what drains within the wait at capacity, Q = ⌊C·wait⌋, and at least B,
// so that each permit given back finds a waiter under overload: a waiting
// operation holds no server connection, so a longer queue costs the
// database nothing (BENCHMARKS.md measures the rule over S = 5–20 ms).
func queueRule(deadline time.Duration, b int, capacity float64) (wait time.Duration, q int) {
	s := time.Duration(float64(b) / capacity * float64(time.Second))
	wait = max(deadline-2*s, 0).Round(time.Millisecond)
	if wait == 0 {
		return 0, 0 // work longer than half the deadline: no queue at all
	}
	return wait, queueFor(wait, b, capacity)
}

// queueFor is the rule's Q for a given wait: max(B, ⌊C·wait⌋).
func queueFor(wait time.Duration, b int, capacity float64) int {
	return max(b, int(math.Floor(capacity*wait.Seconds())))
}

// arrivals returns the start offsets of a Poisson process of rate per
// second over length, from a generator seeded with seed: the same
// arrivals for every configuration.
func arrivals(rate float64, length time.Duration, seed uint64) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var out []time.Duration
	t := 0.0
	for {
		t += rng.ExpFloat64() / rate
		d := time.Duration(t * float64(time.Second))
		if d >= length {
			return out
		}
		out = append(out, d)
	}
}

// The results, as written by --json.
type (
	overloadReport struct {
		cfg              *overloadConfig
		Database         string           `json:"database"`
		CPUs             int              `json:"cpus"`
		GoVersion        string           `json:"go_version"`
		ServerVersion    string           `json:"server_version,omitempty"`
		Shape            string           `json:"shape"`
		Work             string           `json:"work"`
		UnitRows         int              `json:"unit_rows"`                 // N: the cpu query's rows
		UnitMs           float64          `json:"unit_ms,omitempty"`         // S of the shapes that sleep: --service, else the cpu query's unloaded time
		Kinds            []string         `json:"kinds,omitempty"`           // the shape's kinds of request, when more than one
		Sweep            []int            `json:"sweep,omitempty"`           // the static configurations' B
		Cold             bool             `json:"cold,omitempty"`            // --cold
		LockHoldMs       float64          `json:"lock_hold_ms,omitempty"`    // the lock shape's
		BestStatic       []bestStatic     `json:"best_static,omitempty"`     // per load, the static configuration of most goodput
		StaticPolicies   []cli.PolicyJSON `json:"static_policies,omitempty"` // of each B of the sweep
		DeadlineMs       float64          `json:"deadline_ms"`
		ServiceMs        *cli.Pct         `json:"unloaded_service_ms"`              // S: one worker, back to back
		ServiceTargetMs  float64          `json:"service_target_ms,omitempty"`      // the --service S aimed at
		Capacity         float64          `json:"capacity_per_s"`                   // C
		Shift            float64          `json:"shift,omitempty"`                  // --shift
		CapacityShifted  float64          `json:"capacity_shifted_per_s,omitempty"` // C with the work shifted, measured as C is
		Ceiling          int              `json:"ceiling"`                          // of the adaptive configurations
		CapacityMeasured bool             `json:"capacity_measured"`
		CapacityWorkers  int              `json:"capacity_workers"`
		Policy           cli.PolicyJSON   `json:"policy"`
		Rule             bool             `json:"policy_by_rule"`     // Q and the wait came from queueRule
		Workload         string           `json:"workload,omitempty"` // the workload the gate's requests named
		WarmupS          float64          `json:"warmup_s"`
		DurationS        float64          `json:"duration_s"`
		Interrupted      bool             `json:"interrupted"`
		Phases           []*overloadPhase `json:"phases"`           // one per load and configuration: the median round
		Rounds           []*overloadPhase `json:"rounds,omitempty"` // with --rounds above 1: every round's
	}
	bestStatic struct {
		Load        float64 `json:"load"`
		Config      string  `json:"config"`
		B           int     `json:"b"`
		GoodputPerS float64 `json:"goodput_per_s"`
	}
	kindCounts map[string]*kindCount // by the kind's name
	kindCount  struct {
		Arrived        int64 `json:"arrived"`
		WithinDeadline int64 `json:"within_deadline"`
	}
	overloadPhase struct {
		Load             float64        `json:"load"` // multiple of C
		Config           string         `json:"config"`
		Round            int            `json:"round"` // 1 to --rounds
		Setup            string         `json:"setup"`
		B                int            `json:"b,omitempty"`   // static: its B
		RatePerS         float64        `json:"rate_per_s"`    // offered: load × C
		Arrived          int64          `json:"arrived"`       // counted: after the warm-up
		ArrivedPerS      float64        `json:"arrived_per_s"` // Arrived / duration: the rate the arrivals drawn came to
		Committed        int64          `json:"committed"`
		WithinDeadline   int64          `json:"within_deadline"`
		RejectedFull     int64          `json:"rejected_full"`
		RejectedTimeout  int64          `json:"rejected_timeout"`
		RejectedDeadline int64          `json:"rejected_deadline"` // the gate: it would have missed its deadline
		DeadlineExceeded int64          `json:"deadline_exceeded"`
		InterruptedOps   int64          `json:"interrupted"`
		OtherErrors      int64          `json:"other_errors"`
		ErrorSamples     map[string]int `json:"error_samples,omitempty"`
		GoodputPerS      float64        `json:"goodput_per_s"`
		GoodBeforePerS   float64        `json:"goodput_before_shift_per_s,omitempty"` // --shift: of the requests arriving before it
		GoodAfterPerS    float64        `json:"goodput_after_shift_per_s,omitempty"`  // and after
		HighArrived      int64          `json:"high_arrived,omitempty"`               // --high: the high-priority requests counted
		HighGoodPerS     float64        `json:"high_goodput_per_s,omitempty"`         // and their goodput
		HighOutcomes     map[string]int `json:"high_outcomes,omitempty"`              // and their outcomes
		GoodputVsBest    *float64       `json:"goodput_vs_best_static,omitempty"`     // ÷ the best static configuration's at this load
		ByKind           kindCounts     `json:"by_kind,omitempty"`                    // shapes of several kinds: the counted requests of each
		DialsPerS        float64        `json:"dials_per_s"`                          // Connect calls on the driver's connector during the counted duration
		Dials            int64          `json:"dials"`                                // and over the whole phase, warm-up and warm pool included
		Timeline         []float64      `json:"goodput_timeline_per_s,omitempty"`     // goodput by arrival, per timelineStep from the start of the counted duration
		ColdTimeline     []float64      `json:"cold_timeline_per_s,omitempty"`        // --cold: goodput by arrival, per timelineStep from the phase's first arrival, warm-up included
		ColdFirstSPerS   *float64       `json:"cold_first_second_per_s,omitempty"`    // --cold: of the arrivals of the first second
		ColdReachMs      *float64       `json:"cold_reach_ms,omitempty"`              // --cold: the end of the first timelineStep at 0.9 of goodput_per_s; absent: never
		LockAtMs         *float64       `json:"lock_at_ms,omitempty"`                 // lock: when the table was locked, from the start of the counted duration
		LockReleaseMs    *float64       `json:"lock_release_ms,omitempty"`            // lock: and released
		LockError        string         `json:"lock_error,omitempty"`                 // lock: the lock session's error
		GoodAfterRelease *float64       `json:"release_goodput_per_s,omitempty"`      // lock: of the arrivals of the second after the release
		FirstAfterRelMs  *float64       `json:"release_first_good_ms,omitempty"`      // lock: from the release until the first arrival after it committed in time; absent: none did
		MaxLimit         int            `json:"max_limit,omitempty"`                  // adaptive: the highest B in force seen
		LimitTimeline    []int          `json:"limit_timeline,omitempty"`             // adaptive: the B in force at the end of each timelineStep from the start of the counted duration
		LastLimit        int            `json:"last_limit,omitempty"`                 // adaptive: the B in force at the end
		GateWaitMs       *cli.Pct       `json:"gate_wait_ms,omitempty"`               // gates: the wait for the execution permit of the operations admitted, warm-up included
		GateHoldMs       *cli.Pct       `json:"gate_hold_ms,omitempty"`               // gates: how long they held their permits
		Moves            []string       `json:"moves,omitempty"`                      // adaptive: each move of B, "at from→to why queued gain", at in ms from the phase's start
		SuccessMs        *cli.Pct       `json:"success_ms,omitempty"`
		FailureMs        *cli.Pct       `json:"failure_ms,omitempty"` // every failure
		RejectFullMs     *cli.Pct       `json:"rejected_full_ms,omitempty"`
		RejectTimeoutMs  *cli.Pct       `json:"rejected_timeout_ms,omitempty"`
		LagMs            *cli.Pct       `json:"start_lag_ms,omitempty"` // request goroutine start behind its arrival time
		ServerMaxTx      *int           `json:"server_max_transactions,omitempty"`
		ServerMaxConns   *int           `json:"server_max_connections,omitempty"`
		ServerError      string         `json:"server_monitor_error,omitempty"`
		ServerDrainMs    float64        `json:"server_drain_ms,omitempty"`   // after the last request returned, until the server showed none of its work
		ServerTerminated bool           `json:"server_terminated,omitempty"` // its sessions still there after drainLimit were ended
		WarmupOutcomes   map[string]int `json:"warmup_outcomes,omitempty"`   // of the requests not counted, by outcome
	}
)

func (p *overloadPhase) failed() int64 {
	return p.RejectedFull + p.RejectedTimeout + p.RejectedDeadline + p.DeadlineExceeded + p.InterruptedOps + p.OtherErrors
}

func (e *env) runOverload(ctx context.Context, cfg *overloadConfig) (*overloadReport, error) {
	sh := newShape(cfg, cfg.shape, cfg.unit)
	rep := &overloadReport{
		cfg: cfg, Database: cfg.target.Display, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
		Shape: sh.name, Work: sh.work, UnitRows: cfg.unit.rows, Cold: cfg.cold,
		DeadlineMs: cli.Ms(cfg.deadline), CapacityWorkers: cfg.capWorkers,
		WarmupS: cfg.warmup.Seconds(), DurationS: cfg.duration.Seconds(),
	}
	if len(sh.kinds) > 1 {
		rep.Kinds = sh.kinds
	}
	switch sh.name {
	case shapeSleep, shapeOutlier:
		rep.UnitMs = cli.Ms(cfg.unit.s)
	case shapeLock:
		rep.LockHoldMs = cli.Ms(cfg.lockHold)
	}
	if cfg.target.Dialect == cli.DialectPostgres {
		if err := createShapeTables(ctx, cfg.target, sh.name); err != nil {
			return nil, err
		}
	}
	op := sh.measureOp(cfg.seed)
	id := fmt.Sprintf("bh-overload-%d-%d", os.Getpid(), runSeq.Add(1))
	if len(cfg.shapes) > 1 {
		fmt.Fprintf(e.Stderr, "overload: shape %s: %s\n", sh.name, sh.work)
	}

	// S and C, measured on plain database/sql, back to back.
	fmt.Fprintf(e.Stderr, "overload: measuring the unloaded service time (1 worker, %v)\n", cfg.capDuration/3)
	lats, _, err := closedLoop(ctx, cfg, op, id+"-service", 1, cfg.capDuration/3)
	if err != nil {
		return nil, err
	}
	rep.ServiceMs = cli.Percentiles(lats)
	if s := rep.ServiceMs; s != nil && s.P50 >= cli.Ms(cfg.deadline) {
		// Nothing could commit in time: the run would measure nothing.
		return nil, fmt.Errorf("--deadline %v is not above the unloaded service time S (p50 %.1f ms, --cpu-rows %d, --shape %s): no request could commit in time; want a deadline of a few times S, such as %v, or fewer --cpu-rows",
			cfg.deadline, s.P50, cfg.cpuRows, sh.name, (time.Duration(4 * s.P50 * float64(time.Millisecond))).Round(time.Millisecond))
	}
	rep.ServerVersion = serverVersion(ctx, cfg.target)
	rep.Capacity, rep.CapacityMeasured = cfg.capacity, cfg.capacity == 0
	if rep.CapacityMeasured {
		fmt.Fprintf(e.Stderr, "overload: measuring the capacity (%d workers, %v)\n", cfg.capWorkers, cfg.capDuration)
		_, rate, err := closedLoop(ctx, cfg, op, id+"-capacity", cfg.capWorkers, cfg.capDuration)
		if err != nil {
			return nil, err
		}
		if rate <= 0 {
			return nil, errors.New("no transaction committed while measuring the capacity; see --capacity")
		}
		rep.Capacity = rate
	}
	var shifted opFunc
	var shiftAt time.Duration
	if cfg.shift > 0 {
		rows := max(1, int(math.Round(float64(cfg.cpuRows)*cfg.shift)))
		shifted = cli.Operation(cfg.target, "cpu", 0, rows)
		shiftAt = cfg.warmup + cfg.duration/2
		fmt.Fprintf(e.Stderr, "overload: measuring the capacity with the work shifted ×%v (%d rows, %d workers, %v)\n", cfg.shift, rows, cfg.capWorkers, cfg.capDuration)
		_, rate, err := closedLoop(ctx, cfg, shifted, id+"-capacity-shifted", cfg.capWorkers, cfg.capDuration)
		if err != nil {
			return nil, err
		}
		rep.Shift, rep.CapacityShifted = cfg.shift, rate
	}
	rep.Ceiling = cfg.ceiling
	if ctx.Err() != nil {
		rep.Interrupted = true
		return rep, nil
	}
	wait, q := queueRule(cfg.deadline, cfg.b, rep.Capacity)
	rep.Rule = cfg.wait < 0 && cfg.q < 0
	if cfg.wait >= 0 {
		wait = cfg.wait
		if cfg.q < 0 {
			q = queueFor(wait, cfg.b, rep.Capacity)
		}
	}
	if cfg.q >= 0 {
		q = cfg.q
	}
	policy := bulkhead.Policy{MaxConcurrent: cfg.b, MaxQueue: q, QueueWait: wait, DryRun: cfg.dryRun, Workloads: cfg.workloads}
	if cfg.high > 0 {
		policy.Workloads = priorityWorkloads(cfg.b, q, wait)
	}
	if err := policy.Validate(); err != nil {
		return nil, fmt.Errorf("the gate's policy B=%d Q=%d wait=%v (%s) is invalid for --deadline %v and C = %.0f/s: %w; want --queue-wait too, or a longer --deadline",
			policy.MaxConcurrent, policy.MaxQueue, policy.QueueWait, cfg.policySource, cfg.deadline, rep.Capacity, err)
	}
	rep.Policy = cli.PolicyJSON{MaxConcurrent: policy.MaxConcurrent, MaxQueue: policy.MaxQueue, QueueWaitMs: cli.Ms(policy.QueueWait), DryRun: policy.DryRun}
	rep.Workload = cfg.workload
	statics := map[string]bulkhead.Policy{}
	if slices.Contains(cfg.configs, cfgStatic) {
		rep.Sweep = cfg.sweep
		for _, b := range cfg.sweep {
			p, err := staticPolicy(cfg, b, rep.Capacity)
			if err != nil {
				return nil, err
			}
			statics[staticName(b)] = p
			rep.StaticPolicies = append(rep.StaticPolicies, cli.PolicyJSON{MaxConcurrent: p.MaxConcurrent, MaxQueue: p.MaxQueue, QueueWaitMs: cli.Ms(p.QueueWait)})
		}
	}
	fmt.Fprintf(e.Stderr, "overload: S p50 %.1f ms, C %.0f/s; gate B=%d Q=%d wait=%v\n",
		rep.ServiceMs.P50, rep.Capacity, policy.MaxConcurrent, policy.MaxQueue, policy.QueueWait)

	configs := cfg.runConfigs()
	for li, load := range cfg.loads {
		rate := load * rep.Capacity
		if rate > maxOverloadRate {
			return nil, fmt.Errorf("load %v×C is %.0f requests per second, more than %d", load, rate, maxOverloadRate)
		}
		starts := arrivals(rate, cfg.warmup+cfg.duration, cfg.seed+uint64(li))
		w := work{reqs: sh.plan(starts, cfg.seed+uint64(li)), kinds: sh.kinds, at: shiftAt}
		if shifted != nil {
			for i, at := range starts {
				if at >= shiftAt {
					w.reqs[i].op = shifted
				}
			}
		}
		if sh.name == shapeLock && cfg.target.Dialect == cli.DialectPostgres {
			w.lockHold = cfg.lockHold
		}
		w.high = highArrivals(len(starts), cfg.high, cfg.seed+uint64(li))
		var all []*overloadPhase // this load's, every round
		for round := range cfg.rounds {
			// Each round starts with another configuration, so that a
			// drift of the machine's speed over the run hits them alike.
			for i := range configs {
				name := configs[(i+round)%len(configs)]
				if ctx.Err() != nil {
					rep.Interrupted = true
					rep.addMedians(all, configs)
					return rep, nil
				}
				p := policy
				if sp, ok := statics[name]; ok {
					p = sp
				}
				ph, err := runOpenLoop(ctx, cfg, w, fmt.Sprintf("%s-%s-%d-%d", id, name, li, round), name, p, starts)
				if err != nil && ctx.Err() != nil {
					// Interrupted before the phase started: report the rest.
					rep.Interrupted = true
					rep.addMedians(all, configs)
					return rep, nil
				}
				if err != nil {
					return nil, err
				}
				ph.Load, ph.RatePerS, ph.Round = load, rate, round+1
				all = append(all, ph)
				fmt.Fprintf(e.Stderr, "overload: %s×C %-9s goodput %.0f/s, %d of %d committed in time\n",
					fmtLoad(load), name, ph.GoodputPerS, ph.WithinDeadline, ph.Arrived)
			}
		}
		rep.addMedians(all, configs)
	}
	rep.Interrupted = ctx.Err() != nil
	return rep, nil
}

// staticPolicy is the policy of the static configuration of B b: Q and
// the wait as the gate's, given or by the rule for b.
func staticPolicy(cfg *overloadConfig, b int, capacity float64) (bulkhead.Policy, error) {
	wait, q := queueRule(cfg.deadline, b, capacity)
	if cfg.wait >= 0 {
		wait, q = cfg.wait, queueFor(cfg.wait, b, capacity)
	}
	if cfg.q >= 0 {
		q = cfg.q
	}
	p := bulkhead.Policy{MaxConcurrent: b, MaxQueue: q, QueueWait: wait}
	if cfg.high > 0 {
		p.Workloads = priorityWorkloads(b, q, wait)
	}
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("the policy of %s, B=%d Q=%d wait=%v (%s), is invalid for --deadline %v: %w; want other --sweep values or --queue-wait",
			staticName(b), b, q, wait, cfg.policySource, cfg.deadline, err)
	}
	return p, nil
}

// addMedians adds to rep.Phases, for each configuration in order, the
// phase of median goodput among all's rounds (the lower of the two middle
// ones for an even count); with more than one round, all go to rep.Rounds
// too. With static configurations among them, it sets the load's best
// static and each median phase's goodput against it.
func (rep *overloadReport) addMedians(all []*overloadPhase, order []string) {
	if len(all) == 0 {
		return
	}
	multi := false
	n := len(rep.Phases)
	for _, c := range order {
		var runs []*overloadPhase
		for _, ph := range all {
			if ph.Config == c {
				runs = append(runs, ph)
			}
		}
		if len(runs) == 0 {
			continue
		}
		multi = multi || len(runs) > 1
		slices.SortStableFunc(runs, func(a, b *overloadPhase) int { return cmp.Compare(a.GoodputPerS, b.GoodputPerS) })
		rep.Phases = append(rep.Phases, runs[(len(runs)-1)/2])
	}
	if multi {
		rep.Rounds = append(rep.Rounds, all...)
	}
	added := rep.Phases[n:]
	if best := bestOf(added); best != nil {
		b, _ := staticB(best.Config)
		rep.BestStatic = append(rep.BestStatic, bestStatic{Load: best.Load, Config: best.Config, B: b, GoodputPerS: best.GoodputPerS})
		for _, ph := range added {
			if best.GoodputPerS > 0 {
				r := ph.GoodputPerS / best.GoodputPerS
				ph.GoodputVsBest = &r
			}
		}
	}
}

// bestOf returns the static phase of most goodput among phases (of one
// load), the lowest B of equals; nil if none is static.
func bestOf(phases []*overloadPhase) *overloadPhase {
	var best *overloadPhase
	for _, ph := range phases {
		b, ok := staticB(ph.Config)
		if !ok {
			continue
		}
		if best == nil || ph.GoodputPerS > best.GoodputPerS {
			best = ph
		} else if bb, _ := staticB(best.Config); ph.GoodputPerS == best.GoodputPerS && b < bb {
			best = ph
		}
	}
	return best
}

func fmtLoad(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }

// serverVersion returns the PostgreSQL server's version, or "".
func serverVersion(ctx context.Context, t *cli.Target) string {
	if t.Dialect != cli.DialectPostgres {
		return ""
	}
	db := sql.OpenDB(t.PlainConnector("bulkhead-monitor"))
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, cli.ConnectTimeout)
	defer cancel()
	var v string
	if err := db.QueryRowContext(ctx, "SHOW server_version").Scan(&v); err != nil {
		return ""
	}
	return v
}

// closedLoop runs op back to back on workers goroutines for length on a
// plain pool of workers connections, after a warm-up of one operation per
// worker, and returns the latencies and the rate of committed operations.
func closedLoop(ctx context.Context, cfg *overloadConfig, op func(context.Context, *sql.DB) error, app string, workers int, length time.Duration) ([]time.Duration, float64, error) {
	inner, err := cfg.target.Connector(app, false)
	if err != nil {
		return nil, 0, err
	}
	db := sql.OpenDB(inner)
	defer db.Close()
	db.SetMaxOpenConns(workers)
	db.SetMaxIdleConns(workers)
	opTimeout := max(10*cfg.deadline, 10*time.Second)
	one := func() error {
		c, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		return op(c, db)
	}
	var (
		mu    sync.Mutex
		lats  []time.Duration
		first error
		wg    sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			if err := one(); err != nil {
				mu.Lock()
				first = cmpOr(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		if ctx.Err() != nil {
			return nil, 0, errors.New("interrupted before the run started")
		}
		return nil, 0, fmt.Errorf("cannot run the work on %s: %w", cfg.target.Display, first)
	}
	stop, cancel := context.WithTimeout(ctx, length)
	defer cancel()
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for stop.Err() == nil {
				t0 := time.Now()
				err := one()
				d := time.Since(t0)
				mu.Lock()
				if err == nil {
					lats = append(lats, d)
				} else if ctx.Err() == nil {
					first = cmpOr(first, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return nil, 0, fmt.Errorf("measuring on %s: %w", cfg.target.Display, first)
	}
	return lats, float64(len(lats)) / elapsed.Seconds(), nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// adaptivePolicy is the adaptive configuration's policy: B found up to
// the ceiling, Q four times the ceiling, the queue wait the deadline.
func adaptivePolicy(cfg *overloadConfig, p bulkhead.Policy) bulkhead.Policy {
	p.MaxConcurrent, p.MaxQueue, p.QueueWait, p.Adaptive = cfg.ceiling, 4*cfg.ceiling, min(cfg.deadline, bulkhead.MaxQueueWait), true
	p.Workloads = nil
	if cfg.high > 0 {
		p.Workloads = priorityWorkloads(p.MaxConcurrent, p.MaxQueue, p.QueueWait)
	}
	return p
}

// The workloads of --high: high-priority requests and the others, each
// allowed the whole budget.
const (
	wlHigh = "high"
	wlLow  = "low"
)

func priorityWorkloads(b, q int, wait time.Duration) map[string]bulkhead.Workload {
	return map[string]bulkhead.Workload{
		wlHigh: {MaxConcurrent: b, MaxQueue: q, QueueWait: wait, Priority: 1},
		wlLow:  {MaxConcurrent: b, MaxQueue: q, QueueWait: wait},
	}
}

// highArrivals draws, for each of n arrivals, whether it is high-priority,
// with probability share, from a generator seeded with seed.
func highArrivals(n int, share float64, seed uint64) []bool {
	if share <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x5851f42d4c957f2d))
	out := make([]bool, n)
	for i := range out {
		out[i] = rng.Float64() < share
	}
	return out
}

// openOverloadDB opens the *sql.DB of one configuration, and for the
// gate's the gate; the dials of its driver's connector are counted.
func openOverloadDB(cfg *overloadConfig, app, name string, p bulkhead.Policy, glog *gateLog) (*sql.DB, *bulkhead.Gate, string, *countingConnector, error) {
	if name == cfgAdaptive {
		p = adaptivePolicy(cfg, p)
	}
	if _, static := staticB(name); name == cfgGate || name == cfgAdaptive || name == cfgAlone || static {
		// The gate as the README recommends it: on PostgreSQL, pgx returns
		// from a cancelled statement only once the server stopped it
		// (pgxgate.Connector), so that the server runs at most B.
		inner, err := cfg.target.GatedConnector(app, false)
		if err != nil {
			return nil, nil, "", nil, err
		}
		dials := &countingConnector{Connector: inner}
		g, err := bulkhead.New(dials, p, bulkhead.WithEvents(bulkhead.Events{OnLimit: glog.moved, OnAdmit: glog.admitted, OnRelease: glog.released}))
		if err != nil {
			return nil, nil, "", nil, err
		}
		setup := "bulkhead " + cli.PolicySetup(p, cfg.workload)
		if p.Adaptive {
			setup += fmt.Sprintf(", adaptive from 1 to %d", p.MaxConcurrent)
		}
		return g.OpenDB(), g, setup, dials, nil
	}
	inner, err := cfg.target.Connector(app, false)
	if err != nil {
		return nil, nil, "", nil, err
	}
	dials := &countingConnector{Connector: inner}
	db := sql.OpenDB(dials)
	switch name {
	case cfgPlain:
		db.SetMaxIdleConns(p.MaxConcurrent + p.MaxQueue)
		return db, nil, fmt.Sprintf("database/sql, MaxOpenConns unlimited, MaxIdleConns %d", p.MaxConcurrent+p.MaxQueue), dials, nil
	case cfgFsAdaptive, cfgFsAdaptiveWait:
		db.SetMaxIdleConns(cfg.ceiling)
		wait := "none"
		if name == cfgFsAdaptiveWait {
			wait = p.QueueWait.String()
		}
		return db, nil, fmt.Sprintf("failsafe-go adaptivelimiter limits 1-%d start %d queueing 2/3 max wait %s; database/sql, MaxOpenConns unlimited, MaxIdleConns %d",
			cfg.ceiling, min(4, cfg.ceiling), wait, cfg.ceiling), dials, nil
	}
	// semaphore, and the pool behind waitfirst's and fsbulkhead's
	// permits: B connections.
	db.SetMaxOpenConns(p.MaxConcurrent)
	db.SetMaxIdleConns(p.MaxConcurrent)
	switch name {
	case cfgWaitFirst:
		return db, nil, fmt.Sprintf("wait-before-checkout bulkhead B=%d wait=%v, queue unbounded; database/sql, MaxOpenConns %d", p.MaxConcurrent, p.QueueWait, p.MaxConcurrent), dials, nil
	case cfgFsBulkhead:
		return db, nil, fmt.Sprintf("failsafe-go bulkhead B=%d max wait %v; database/sql, MaxOpenConns %d", p.MaxConcurrent, p.QueueWait, p.MaxConcurrent), dials, nil
	}
	return db, nil, fmt.Sprintf("database/sql, MaxOpenConns %d", p.MaxConcurrent), dials, nil
}

// work is what the requests of one load run.
type work struct {
	reqs     []request     // one per arrival
	kinds    []string      // the names of the requests' kinds
	at       time.Duration // --shift: the arrival offset from which the work is shifted; 0: no shift
	high     []bool        // --high: whether each arrival is high-priority; nil: none is
	lockHold time.Duration // the lock shape: how long the table is held; 0: no lock
}

// phaseRec collects one phase's outcomes. Only requests that arrived after
// the warm-up are counted; those committed in time are kept, warm-up
// included, for the figures over time.
type phaseRec struct {
	mu sync.Mutex
	// Of the high-priority requests (--high): all, and those committed
	// within their deadline.
	highN, highGood int64
	highOut         [cli.NumOutcomes]int
	n               [cli.NumOutcomes]int64
	good            int64
	kinds           []kindCount // by the request's kind
	goods           []goodRec
	ok              []time.Duration
	fail            []time.Duration
	full            []time.Duration
	timeout         []time.Duration
	lag             []time.Duration
	errs            map[string]int
	warm            [cli.NumOutcomes]int // outcomes of the requests of the warm-up
}

// goodRec is a request committed within its deadline: when it arrived and
// when it returned, from the phase's start.
type goodRec struct{ at, done time.Duration }

// outcomeNames name the outcomes in the JSON.
var outcomeNames = [cli.NumOutcomes]string{
	cli.OutCompleted: "committed", cli.OutRejectedFull: "rejected_full", cli.OutRejectedTimeout: "rejected_timeout", cli.OutRejectedDeadline: "rejected_deadline",
	cli.OutDeadline: "deadline_exceeded", cli.OutInterrupted: "interrupted", cli.OutOther: "other",
}

// add records a request r that arrived at offset at and returned at done,
// counted or of the warm-up.
func (rec *phaseRec) add(o cli.Outcome, lat, lag time.Duration, err error, r request, at, done time.Duration, high, counted bool) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	good := o == cli.OutCompleted && lat <= r.deadline
	if good {
		rec.goods = append(rec.goods, goodRec{at, done})
	}
	if !counted {
		rec.warm[o]++
		return
	}
	rec.n[o]++
	rec.kinds[r.kind].Arrived++
	if good {
		rec.kinds[r.kind].WithinDeadline++
	}
	if high {
		rec.highN++
		rec.highOut[o]++
		if good {
			rec.highGood++
		}
	}
	rec.lag = append(rec.lag, lag)
	switch o {
	case cli.OutCompleted:
		rec.ok = append(rec.ok, lat)
		if good {
			rec.good++
		}
		return
	case cli.OutRejectedFull:
		rec.full = append(rec.full, lat)
	case cli.OutRejectedTimeout:
		rec.timeout = append(rec.timeout, lat)
	case cli.OutOther:
		cli.AddErrSample(rec.errs, err)
	}
	rec.fail = append(rec.fail, lat)
}

// timeline returns the goodput, by arrival, of each timelineStep of the
// arrivals from from to from+length (the last step cut at the end).
func timeline(goods []goodRec, from, length time.Duration) []float64 {
	n := make([]int64, (length+timelineStep-1)/timelineStep)
	for _, g := range goods {
		if g.at >= from && g.at < from+length {
			n[(g.at-from)/timelineStep]++
		}
	}
	out := make([]float64, len(n))
	for i, c := range n {
		step := min(timelineStep, length-time.Duration(i)*timelineStep)
		out[i] = float64(c) / step.Seconds()
	}
	return out
}

// reachMs returns the end, in ms, of the first step of tl at target or
// above, or nil if none is.
func reachMs(tl []float64, target float64) *float64 {
	for i, v := range tl {
		if v >= target {
			ms := cli.Ms(time.Duration(i+1) * timelineStep)
			return &ms
		}
	}
	return nil
}

// countingConnector counts the dials of its connector.
type countingConnector struct {
	driver.Connector
	dials atomic.Int64
}

func (c *countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c.dials.Add(1)
	return c.Connector.Connect(ctx)
}

// Close closes the inner connector if it is an io.Closer, as database/sql
// would have.
func (c *countingConnector) Close() error {
	if cl, ok := c.Connector.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// runOpenLoop offers the arrivals starts to one configuration and returns
// what it measured.
func runOpenLoop(ctx context.Context, cfg *overloadConfig, w work, app, name string, p bulkhead.Policy, starts []time.Duration) (*overloadPhase, error) {
	glog := &gateLog{start: time.Now()}
	db, gate, setup, dials, err := openOverloadDB(cfg, app, name, p, glog)
	if err != nil {
		return nil, err
	}
	closed := false
	defer func() {
		if !closed {
			db.Close()
		}
	}()
	// Every configuration starts with the server connections it uses
	// already dialed (unless --cold): B+Q, what the plain pool keeps idle;
	// B for the others (the gate's operations never hold more), adaptive's
	// included: its B starts lower and moves near it, and sessions dialed
	// beyond what runs at once only spread the work over colder backends.
	idle := p.MaxConcurrent
	do := func(ctx context.Context, db *sql.DB, op opFunc) error { return op(ctx, db) }
	switch name {
	case cfgPlain:
		idle = p.MaxConcurrent + p.MaxQueue
	case cfgWaitFirst:
		do = (&waitFirst{b: p.MaxConcurrent, wait: p.QueueWait}).do
	case cfgFsBulkhead:
		do = fsDo(newFsBulkhead(p.MaxConcurrent, p.QueueWait))
	case cfgFsAdaptive, cfgFsAdaptiveWait:
		idle = cfg.ceiling
		var wait time.Duration
		if name == cfgFsAdaptiveWait {
			wait = p.QueueWait
		}
		do = fsDo(newFsAdaptive(cfg.ceiling, wait))
	}
	_, static := staticB(name)
	gated := name == cfgGate || name == cfgAdaptive || name == cfgAlone || static
	if !cfg.cold {
		if err := warmPool(ctx, db, idle, cfg.target.StartTimeout()); err != nil {
			if ctx.Err() != nil {
				return nil, errors.New("interrupted before the run started")
			}
			return nil, fmt.Errorf("cannot connect to %s: %w", cfg.target.Display, err)
		}
	}
	var mon *activityMonitor
	if cfg.target.Dialect == cli.DialectPostgres {
		if mon, err = startActivityMonitor(ctx, cfg.target, app); err != nil {
			return nil, err
		}
		defer mon.Close()
	}
	var locker *lockHolder
	if w.lockHold > 0 {
		if locker, err = openLockHolder(ctx, cfg.target, app+"-lock"); err != nil {
			return nil, err
		}
		defer locker.close()
	}

	reqCtx := ctx
	if name == cfgGate && cfg.workload != "" {
		reqCtx = bulkhead.WithWorkload(ctx, cfg.workload)
	}
	rec := &phaseRec{errs: map[string]int{}, kinds: make([]kindCount, len(w.kinds))}
	var limits *limitWatch
	if gate != nil && name == cfgAdaptive {
		limits = watchLimit(gate)
		defer limits.stop()
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var wg sync.WaitGroup
	begin := time.Now()
	// The dials at the start and the end of the counted duration.
	var dialsFrom, dialsTo atomic.Int64
	dialsFrom.Store(-1)
	dialsTo.Store(-1)
	fromT := time.AfterFunc(cfg.warmup, func() { dialsFrom.Store(dials.dials.Load()) })
	toT := time.AfterFunc(cfg.warmup+cfg.duration, func() { dialsTo.Store(dials.dials.Load()) })
	if locker != nil {
		locker.start(ctx, begin, cfg.warmup+lockAt(cfg.duration), w.lockHold)
	}
	for i, at := range starts {
		high := w.high != nil && w.high[i]
		if name == cfgAlone && !high {
			continue
		}
		if d := time.Until(begin.Add(at)); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		counted := at >= cfg.warmup
		arrival := begin.Add(at)
		r := w.reqs[i]
		rctx := reqCtx
		if w.high != nil && gated {
			rctx = bulkhead.WithWorkload(reqCtx, map[bool]string{true: wlHigh, false: wlLow}[high])
		}
		wg.Go(func() {
			t0 := time.Now()
			opCtx, cancel := context.WithTimeout(rctx, r.deadline)
			err := do(opCtx, db, r.op)
			lat := time.Since(t0)
			o := cli.Classify(err, opCtx, ctx)
			if fo, ok := fsOutcome(err); ok {
				o = fo
			}
			cancel()
			rec.add(o, lat, t0.Sub(arrival), err, r, at, time.Since(begin), high, counted)
		})
	}
	wg.Wait()
	if locker != nil {
		locker.wait()
	}
	fromT.Stop()
	toT.Stop()
	ph := &overloadPhase{Config: name, Setup: setup}
	if static {
		ph.B = p.MaxConcurrent
	}
	ph.Dials = dials.dials.Load()
	from, to := dialsFrom.Load(), dialsTo.Load()
	if to < 0 {
		to = ph.Dials // interrupted before the end
	}
	if from >= 0 {
		ph.DialsPerS = float64(to-from) / cfg.duration.Seconds()
	}
	if limits != nil {
		ph.MaxLimit, ph.LastLimit = limits.stop()
		ph.LimitTimeline = limits.timeline(cfg.warmup)
		ph.Moves = glog.all()
	}
	if gate != nil {
		ph.GateWaitMs, ph.GateHoldMs = glog.percentiles()
	}
	db.Close()
	closed = true
	if mon != nil {
		t0 := time.Now()
		// Sessions still running after drainLimit (statements their client
		// gave up on) are ended, so that they load no configuration after.
		if !mon.Drain(drainLimit, overloadPoll) && mon.Terminate() == nil {
			ph.ServerTerminated = true
			mon.Drain(drainLimit, overloadPoll)
		}
		ph.ServerDrainMs = cli.Ms(time.Since(t0))
		mon.Stop()
		if mon.seen {
			tx, conns := mon.maxTx, mon.maxConns
			ph.ServerMaxTx, ph.ServerMaxConns = &tx, &conns
		}
		if mon.err != nil {
			ph.ServerError = cli.OneLine(mon.err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	ph.Committed = rec.n[cli.OutCompleted]
	ph.WithinDeadline = rec.good
	ph.RejectedFull = rec.n[cli.OutRejectedFull]
	ph.RejectedTimeout = rec.n[cli.OutRejectedTimeout]
	ph.RejectedDeadline = rec.n[cli.OutRejectedDeadline]
	ph.DeadlineExceeded = rec.n[cli.OutDeadline]
	ph.InterruptedOps = rec.n[cli.OutInterrupted]
	ph.OtherErrors = rec.n[cli.OutOther]
	ph.Arrived = ph.Committed + ph.failed()
	ph.ArrivedPerS = float64(ph.Arrived) / cfg.duration.Seconds()
	ph.GoodputPerS = float64(ph.WithinDeadline) / cfg.duration.Seconds()
	ph.Timeline = timeline(rec.goods, cfg.warmup, cfg.duration)
	if len(w.kinds) > 1 {
		ph.ByKind = kindCounts{}
		for k, c := range rec.kinds {
			ph.ByKind[w.kinds[k]] = &c
		}
	}
	if w.high != nil {
		ph.HighArrived, ph.HighGoodPerS = rec.highN, float64(rec.highGood)/cfg.duration.Seconds()
		ph.HighOutcomes = map[string]int{}
		for o, n := range rec.highOut {
			if n > 0 {
				ph.HighOutcomes[outcomeNames[o]] = n
			}
		}
	}
	if w.at > 0 {
		before := countArrived(rec.goods, cfg.warmup, w.at)
		ph.GoodBeforePerS = float64(before) / (w.at - cfg.warmup).Seconds()
		ph.GoodAfterPerS = float64(rec.good-before) / (cfg.warmup + cfg.duration - w.at).Seconds()
	}
	if cfg.cold {
		ph.ColdTimeline = timeline(rec.goods, 0, cfg.warmup+cfg.duration)
		first := min(time.Second, cfg.warmup+cfg.duration)
		v := float64(countArrived(rec.goods, 0, first)) / first.Seconds()
		ph.ColdFirstSPerS = &v
		if ph.GoodputPerS > 0 {
			ph.ColdReachMs = reachMs(ph.ColdTimeline, 0.9*ph.GoodputPerS)
		}
	}
	if locker != nil {
		ph.lockFigures(locker, rec.goods, cfg.warmup, cfg.warmup+cfg.duration)
	}
	ph.SuccessMs = cli.Percentiles(rec.ok)
	ph.FailureMs = cli.Percentiles(rec.fail)
	ph.RejectFullMs = cli.Percentiles(rec.full)
	ph.RejectTimeoutMs = cli.Percentiles(rec.timeout)
	ph.LagMs = cli.Percentiles(rec.lag)
	if len(rec.errs) > 0 {
		ph.ErrorSamples = rec.errs
	}
	for o, n := range rec.warm {
		if n > 0 {
			if ph.WarmupOutcomes == nil {
				ph.WarmupOutcomes = map[string]int{}
			}
			ph.WarmupOutcomes[outcomeNames[o]] = n
		}
	}
	return ph, nil
}

// countArrived counts the goods that arrived from from to before to.
func countArrived(goods []goodRec, from, to time.Duration) int64 {
	var n int64
	for _, g := range goods {
		if g.at >= from && g.at < to {
			n++
		}
	}
	return n
}

// lockFigures sets the lock shape's figures of a phase from its lock
// session and its goods; offsets are from the phase's start, the counted
// duration from counted to end.
func (ph *overloadPhase) lockFigures(l *lockHolder, goods []goodRec, counted, end time.Duration) {
	if l.err != nil {
		ph.LockError = cli.OneLine(l.err)
	}
	if l.locked > 0 {
		v := cli.Ms(l.locked - counted)
		ph.LockAtMs = &v
	}
	rel := l.released
	if rel <= 0 {
		return
	}
	v := cli.Ms(rel - counted)
	ph.LockReleaseMs = &v
	if win := min(time.Second, end-rel); win > 0 {
		g := float64(countArrived(goods, rel, rel+win)) / win.Seconds()
		ph.GoodAfterRelease = &g
	}
	first := time.Duration(-1)
	for _, g := range goods {
		if g.at >= rel && (first < 0 || g.done-rel < first) {
			first = g.done - rel
		}
	}
	if first >= 0 {
		ms := cli.Ms(first)
		ph.FirstAfterRelMs = &ms
	}
}

// warmPool dials n connections in db's pool, within limit, and leaves
// them idle.
func warmPool(ctx context.Context, db *sql.DB, n int, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		if err := c.PingContext(ctx); err != nil {
			return err
		}
	}
	return nil
}

// activityMonitor polls pg_stat_activity every overloadPoll, on its own
// connection, for the most transactions and connections of one
// application_name; it stops counting at the first failed reading.
type activityMonitor struct {
	*cli.Poller

	// Written by the polling goroutine; read after stop.
	maxTx, maxConns int
	seen            bool
	err             error
}

func startActivityMonitor(ctx context.Context, t *cli.Target, app string) (*activityMonitor, error) {
	a, err := cli.OpenActivityDB(ctx, t, app)
	if err != nil {
		return nil, err
	}
	m := &activityMonitor{}
	m.Poller = a.Poll(overloadPoll, func(_ time.Time, tx, conns int, err error) {
		switch {
		case m.err != nil:
		case err != nil:
			m.err = err
		default:
			m.seen = true
			m.maxTx, m.maxConns = max(m.maxTx, tx), max(m.maxConns, conns)
		}
	})
	return m, nil
}

// phase returns the result of one load and configuration, or nil.
func (rep *overloadReport) phase(load float64, config string) *overloadPhase {
	for _, p := range rep.Phases {
		if p.Load == load && p.Config == config {
			return p
		}
	}
	return nil
}

func (rep *overloadReport) printTable(w io.Writer) {
	cfg := rep.cfg
	fmt.Fprintf(w, "\noverload on %s (%d CPUs, shared by this client and a local server), %s\n", rep.Database, rep.CPUs, rep.Work)
	if rep.ServiceMs != nil {
		fmt.Fprintf(w, "unloaded service time S: p50 %.1f ms, p99 %.1f ms; ", rep.ServiceMs.P50, rep.ServiceMs.P99)
	}
	how := "measured"
	if !rep.CapacityMeasured {
		how = "given"
	}
	fmt.Fprintf(w, "capacity C: %.0f/s (%s, %d workers)\n", rep.Capacity, how, rep.CapacityWorkers)
	rule := ""
	if rep.Rule {
		rule = " (by the rule: wait = D − 2·B/C, Q = max(B, ⌊C·wait⌋))"
	}
	cold := ""
	if rep.Cold {
		cold = ", cold (no connection dialed before)"
	}
	fmt.Fprintf(w, "deadline %v; gate B=%d Q=%d wait=%vms%s; each load %v after %v of warm-up%s\n",
		cfg.deadline, rep.Policy.MaxConcurrent, rep.Policy.MaxQueue, rep.Policy.QueueWaitMs, rule, cfg.duration, cfg.warmup, cold)
	if len(rep.StaticPolicies) > 0 {
		var parts []string
		for _, sp := range rep.StaticPolicies {
			parts = append(parts, fmt.Sprintf("B=%d Q=%d wait=%vms", sp.MaxConcurrent, sp.MaxQueue, sp.QueueWaitMs))
		}
		fmt.Fprintf(w, "static: %s\n", strings.Join(parts, "; "))
	}
	fmt.Fprintln(w)
	if len(rep.Phases) == 0 {
		fmt.Fprintln(w, "nothing measured: interrupted")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "load\tconfig\tarrived/s\tgoodput/s\tok p50\tok p99\tfail p99\tfull p99\tarrived\tcommitted\tfull\ttimeout\tlate\tdeadline\tother\tdials/s\tsrv tx\tsrv conns\t")
	p := func(x *cli.Pct, f func(*cli.Pct) float64) string {
		if x == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f", f(x))
	}
	p50 := func(x *cli.Pct) float64 { return x.P50 }
	p99 := func(x *cli.Pct) float64 { return x.P99 }
	srv := func(v *int) string {
		if v == nil {
			return "-"
		}
		return strconv.Itoa(*v)
	}
	for _, ph := range rep.Phases {
		fmt.Fprintf(tw, "%s×C\t%s\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f\t%s\t%s\t\n",
			fmtLoad(ph.Load), ph.Config, ph.ArrivedPerS, ph.GoodputPerS, p(ph.SuccessMs, p50), p(ph.SuccessMs, p99),
			p(ph.FailureMs, p99), p(ph.RejectFullMs, p99), ph.Arrived, ph.Committed, ph.RejectedFull,
			ph.RejectedTimeout, ph.RejectedDeadline, ph.DeadlineExceeded, ph.OtherErrors+ph.InterruptedOps, ph.DialsPerS, srv(ph.ServerMaxTx), srv(ph.ServerMaxConns))
	}
	tw.Flush()
	fmt.Fprintln(w, "(latencies in ms; full = rejected at once, admission full; timeout = rejected after the queue wait; late = rejected, at once or after a wait, as it would have missed its deadline; other includes interrupted; dials/s = connections dialed per second of the counted time)")
	fmt.Fprintln(w)
	for _, load := range cfg.loads {
		for _, mine := range []string{cfgGate, cfgAdaptive} {
			g := rep.phase(load, mine)
			if g == nil {
				continue
			}
			var parts []string
			for _, other := range overloadConfigs {
				if o := rep.phase(load, other); o != nil && other != mine && other != cfgAdaptive {
					part := fmt.Sprintf("%s × %s", ratio(g.GoodputPerS, o.GoodputPerS), other)
					if r := rep.roundRatios(load, mine, other); r != "" {
						part += " (by round " + r + ")"
					}
					parts = append(parts, part)
				}
			}
			if len(parts) > 0 {
				fmt.Fprintf(w, "%s×C: %s goodput = %s\n", fmtLoad(load), mine, strings.Join(parts, ", "))
			}
			if mine == cfgAdaptive {
				fmt.Fprintf(w, "%s×C: adaptive B at most %d, %d at the end (ceiling %d)\n", fmtLoad(load), g.MaxLimit, g.LastLimit, rep.Ceiling)
			}
		}
	}
	for _, b := range rep.BestStatic {
		fmt.Fprintf(w, "%s×C: best static B = %d, goodput %.0f/s\n", fmtLoad(b.Load), b.B, b.GoodputPerS)
	}
	for _, ph := range rep.Phases {
		rep.printShapeLines(w, ph)
	}
	if cfg.high > 0 {
		fmt.Fprintf(w, "\nhigh-priority requests (%v of the arrivals):\n", cfg.high)
		for _, ph := range rep.Phases {
			line := fmt.Sprintf("%s×C %s: %d arrived, goodput %.0f/s", fmtLoad(ph.Load), ph.Config, ph.HighArrived, ph.HighGoodPerS)
			if a := rep.phase(ph.Load, cfgAlone); a != nil && ph != a {
				line += fmt.Sprintf(" = %s × alone", ratio(ph.HighGoodPerS, a.HighGoodPerS))
			}
			fmt.Fprintln(w, line)
		}
	}
	if rep.Shift > 0 {
		fmt.Fprintf(w, "\nwork ×%v from %v into the counted %v: C %.0f/s before, %.0f/s after (measured as C is)\n",
			rep.Shift, cfg.duration/2, cfg.duration, rep.Capacity, rep.CapacityShifted)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "load\tconfig\tgoodput before/s\t÷ C\tafter/s\t÷ C after\t")
		for _, ph := range rep.Phases {
			fmt.Fprintf(tw, "%s×C\t%s\t%.0f\t%s\t%.1f\t%s\t\n", fmtLoad(ph.Load), ph.Config,
				ph.GoodBeforePerS, ratio(ph.GoodBeforePerS, rep.Capacity), ph.GoodAfterPerS, ratio(ph.GoodAfterPerS, rep.CapacityShifted))
		}
		tw.Flush()
	}
	for _, ph := range rep.Phases {
		keys := make([]string, 0, len(ph.ErrorSamples))
		for k := range ph.ErrorSamples {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "%s×C %s: other error ×%d: %s\n", fmtLoad(ph.Load), ph.Config, ph.ErrorSamples[k], k)
		}
		if ph.ServerError != "" {
			fmt.Fprintf(w, "%s×C %s: pg_stat_activity monitor stopped: %s\n", fmtLoad(ph.Load), ph.Config, ph.ServerError)
		}
		if ph.LockError != "" {
			fmt.Fprintf(w, "%s×C %s: the lock session failed: %s\n", fmtLoad(ph.Load), ph.Config, ph.LockError)
		}
	}
	if rep.Interrupted {
		fmt.Fprintln(w, "interrupted: the results above are those measured before")
	}
}

// roundRatios formats, for each round, mine's goodput over other's at
// load, or "" with one round.
func (rep *overloadReport) roundRatios(load float64, mine, other string) string {
	var out []string
	for _, g := range rep.Rounds {
		if g.Load != load || g.Config != mine {
			continue
		}
		for _, o := range rep.Rounds {
			if o.Load == load && o.Config == other && o.Round == g.Round {
				out = append(out, ratio(g.GoodputPerS, o.GoodputPerS))
			}
		}
	}
	return strings.Join(out, ", ")
}

// ratio formats a/b, or "∞" when b is 0 and a is not.
func ratio(a, b float64) string {
	switch {
	case b > 0:
		return fmt.Sprintf("%.2f", a/b)
	case a > 0:
		return "∞"
	}
	return "-"
}

// gateLog records the moves of adaptive B (Events.OnLimit), and the gate's
// waits and holds.
type gateLog struct {
	start        time.Time
	mu           sync.Mutex
	moves        []string
	waits, holds []time.Duration
}

func (l *gateLog) admitted(e bulkhead.Event) {
	l.mu.Lock()
	l.waits = append(l.waits, e.Waited)
	l.mu.Unlock()
}

func (l *gateLog) released(e bulkhead.Event) {
	l.mu.Lock()
	l.holds = append(l.holds, e.Held)
	l.mu.Unlock()
}

func (l *gateLog) moved(m bulkhead.Move) {
	at := time.Since(l.start).Milliseconds()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.moves = append(l.moves, fmt.Sprintf("%d %d→%d %s q%.2f g%.2f", at, m.From, m.To, m.Why, m.Queued, m.Gain))
}

func (l *gateLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.moves)
}

// percentiles returns those of the waits and holds recorded.
func (l *gateLog) percentiles() (waits, holds *cli.Pct) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return cli.Percentiles(l.waits), cli.Percentiles(l.holds)
}

// limitWatch polls a gate's B in force every overloadPoll, for the
// adaptive configuration.
type limitWatch struct {
	done      chan struct{}
	finished  chan struct{}
	once      sync.Once
	start     time.Time
	max, last int
	samples   []limitSample
}

type limitSample struct {
	at time.Duration // since the watch started
	b  int
}

func watchLimit(g *bulkhead.Gate) *limitWatch {
	w := &limitWatch{done: make(chan struct{}), finished: make(chan struct{}), start: time.Now()}
	go func() {
		defer close(w.finished)
		t := time.NewTicker(overloadPoll)
		defer t.Stop()
		for {
			b := g.Stats().MaxConcurrent
			w.max, w.last = max(w.max, b), b
			w.samples = append(w.samples, limitSample{time.Since(w.start), b})
			select {
			case <-w.done:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// stop ends the polling (once) and returns the highest B seen and the last.
func (w *limitWatch) stop() (maxB, last int) {
	w.once.Do(func() { close(w.done) })
	<-w.finished
	return w.max, w.last
}

// timeline returns, after stop, the B in force at the end of each
// timelineStep from offset on.
func (w *limitWatch) timeline(offset time.Duration) []int {
	var out []int
	for _, s := range w.samples {
		if s.at < offset {
			continue
		}
		i := int((s.at - offset) / timelineStep)
		for len(out) <= i {
			out = append(out, s.b)
		}
		out[i] = s.b
	}
	return out
}
