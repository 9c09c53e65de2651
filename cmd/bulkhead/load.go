package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
)

const loadUsage = `Usage: bulkhead load [--dsn URL] [--clients N] [--duration D | --count N] [flags]

A closed-loop load: N clients run operations back to back, each a
transaction that holds the database for --hold (pg_sleep on PostgreSQL,
SLEEP on MySQL, an open transaction on the embedded SQLite) or does
CPU-bound work (--work cpu), with a deadline per operation (--deadline),
through the gate (--max-concurrent B, --max-queue Q, --queue-wait, --adaptive; the
defaults come from the BULKHEAD_* environment). A client whose operation
failed pauses --backoff before the next one, like a caller honouring
Retry-After. With --baseline the same load then runs without the gate, on
plain database/sql with --max-open-conns, and both are shown side by side.

At the end it prints, for each run: throughput, goodput (operations that
finished within their deadline), p50/p95/p99 latency of successes, p99
wait for an execution permit, rejections by cause, other errors and, on
PostgreSQL, the most transactions and connections the server showed for
the run (pg_stat_activity, polled on a separate connection). attempted =
completed + every kind of failure. Ctrl-C stops the run and still reports.
`

const loadExamples = `  bulkhead load --clients 16 --duration 5s
  bulkhead load --dsn postgres://postgres@127.0.0.1:5432/test --clients 32 --duration 10s \
      --max-concurrent 4 --max-queue 4 --queue-wait 20ms --hold 20ms --deadline 100ms \
      --baseline --max-open-conns 4 --chart docs/load.svg
  bulkhead load --dsn postgres://postgres@127.0.0.1:5432/test --work cpu --clients 8 --count 2000 --json -
`

// Limits of the load flags.
const (
	maxLoadLength  = 24 * time.Hour
	sampleInterval = 50 * time.Millisecond // gauges for the chart
	pollInterval   = 20 * time.Millisecond // pg_stat_activity
	termRefresh    = 250 * time.Millisecond
)

// loadConfig is a validated load command line.
type loadConfig struct {
	target   *cli.Target
	clients  int
	duration time.Duration // 0: no time limit (--count alone)
	count    int64         // 0: no count limit
	work     string        // "hold" or "cpu"
	cpuRows  int           // rows summed by --work cpu
	hold     time.Duration
	deadline time.Duration
	policy   bulkhead.Policy
	baseline bool
	maxOpen  int
	backoff  time.Duration
	progress time.Duration // 0: no progress lines
	out      cli.Outputs
	workload string // "": untagged
}

func (e *env) load(ctx context.Context, args []string) int {
	cfg, code, done := e.parseLoad(args)
	if done {
		return code
	}
	report, err := e.runLoad(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(e.Stderr, "bulkhead: load: interrupted before anything was measured")
			return cli.ExitInterrupted
		}
		return e.Fail(fmt.Errorf("load: %w", err))
	}
	chart := func(path string) error { return writeChart(path, report) }
	return e.Report(ctx, "load", cfg.out, true, report.printTable, chart, report)
}

func (e *env) parseLoad(args []string) (*loadConfig, int, bool) {
	fs := e.NewFlagSet("load", loadUsage, loadExamples)
	dsn := fs.String("dsn", "", "database URL: postgres://... or mysql://...")
	clients := fs.Int("clients", 16, "concurrent clients")
	duration := fs.Duration("duration", 10*time.Second, "how long clients start operations (with --count alone: no limit)")
	count := fs.Int64("count", 0, "total operations to attempt (0: no limit, run for --duration)")
	work := fs.String("work", "hold", "what an operation does: hold (a transaction held for --hold) or cpu (a CPU-bound query)")
	cpuRows := fs.Int("cpu-rows", 70000, "rows a --work cpu query sums (generate_series on PostgreSQL)")
	hold := fs.Duration("hold", 20*time.Millisecond, "how long a --work hold transaction holds the database")
	deadline := fs.Duration("deadline", 100*time.Millisecond, "deadline of each operation")
	baseline := fs.Bool("baseline", false, "also run the same load without the gate, on plain database/sql")
	maxOpen := fs.Int("max-open-conns", 0, "baseline: database/sql SetMaxOpenConns (default B)")
	backoff := fs.Duration("backoff", 10*time.Millisecond, "pause of a client after a failed operation (0: retry at once)")
	progress := fs.Duration("progress", time.Second, "interval of progress lines when stderr is not a terminal (0: none)")
	out := cli.AddOutputFlags(fs, "the run(s)")
	workload := fs.String("workload", "", "tag the gated run's operations with this workload of the policy (--workloads)")
	pi := e.AddPolicyFlags(fs)
	set, code, done := e.Parse(fs, args)
	if done {
		return nil, code, true
	}
	bad := cli.Failer[loadConfig](e.Env, "load")
	cfg := &loadConfig{
		clients: *clients, duration: *duration, count: *count, work: *work, cpuRows: *cpuRows, hold: *hold,
		deadline: *deadline, baseline: *baseline, maxOpen: *maxOpen, backoff: *backoff,
		progress: *progress, out: *out,
	}
	switch {
	case cfg.clients < 1 || cfg.clients > cli.MaxClients:
		return bad("--clients is %d, want 1 to %d", cfg.clients, cli.MaxClients)
	case cfg.count < 0:
		return bad("--count is %d, want at least 0", cfg.count)
	case set["duration"] && (cfg.duration <= 0 || cfg.duration > maxLoadLength):
		return bad("--duration is %v, want more than 0s and at most %v", cfg.duration, maxLoadLength)
	case cfg.work != "hold" && cfg.work != "cpu":
		return bad("--work is %q, want hold or cpu", cfg.work)
	case cfg.cpuRows < 1 || cfg.cpuRows > 1_000_000_000:
		return bad("--cpu-rows is %d, want 1 to 1000000000", cfg.cpuRows)
	case cfg.hold < 0 || cfg.hold > time.Hour:
		return bad("--hold is %v, want 0s to 1h0m0s", cfg.hold)
	case cfg.deadline <= 0 || cfg.deadline > time.Hour:
		return bad("--deadline is %v, want more than 0s and at most 1h0m0s", cfg.deadline)
	case cfg.maxOpen < 0:
		return bad("--max-open-conns is %d, want at least 0", cfg.maxOpen)
	case cfg.backoff < 0 || cfg.backoff > time.Minute:
		return bad("--backoff is %v, want 0s to 1m0s", cfg.backoff)
	case cfg.progress < 0:
		return bad("--progress is %v, want at least 0s", cfg.progress)
	}
	// Flags that would do nothing in this mode.
	switch {
	case set["max-open-conns"] && !cfg.baseline:
		return bad("--max-open-conns %d does nothing without --baseline (it sets the baseline's pool); want --baseline too, or no --max-open-conns", cfg.maxOpen)
	case set["cpu-rows"] && cfg.work != "cpu":
		return bad("--cpu-rows %d does nothing with --work %s; want --work cpu too, or no --cpu-rows", cfg.cpuRows, cfg.work)
	case set["hold"] && cfg.work != "hold":
		return bad("--hold %v does nothing with --work %s; want --work hold, or no --hold", cfg.hold, cfg.work)
	}
	if cfg.count > 0 && !set["duration"] {
		cfg.duration = 0
	}
	if err := cfg.out.Check(); err != nil {
		return bad("%w", err)
	}
	r, err := pi.ResolveChecked(set, bulkhead.DefaultPolicy, (*cli.Resolved).Check)
	if err == nil {
		err = cli.CheckWorkload(r, *workload, set)
	}
	if err != nil {
		return bad("%w", err)
	}
	p := r.P
	cfg.policy, cfg.workload = p, *workload
	if cfg.maxOpen == 0 {
		cfg.maxOpen = p.MaxConcurrent
	}
	t, err := e.ResolveTarget(*dsn, set["dsn"])
	if err != nil {
		return bad("%w", err)
	}
	cfg.target = t
	return cfg, cli.ExitOK, false
}

// loadRun is one run of the experiment: gated or baseline.
type loadRun struct {
	name   string
	setup  string
	db     *sql.DB
	gate   *bulkhead.Gate // nil for the baseline
	app    string         // application_name on PostgreSQL
	rec    *recorder
	gauges func() (running, waiting int)
	tag    string // the workload the operations name, if any
}

// opCtx is the context of the run's operations: tagged with its workload.
func (r *loadRun) opCtx(ctx context.Context) context.Context {
	if r.tag == "" {
		return ctx
	}
	return bulkhead.WithWorkload(ctx, r.tag)
}

var loadSeq atomic.Int64

func (e *env) runLoad(ctx context.Context, cfg *loadConfig) (*loadReport, error) {
	report := &loadReport{cfg: cfg}
	id := fmt.Sprintf("bulkhead-load-%d-%d", os.Getpid(), loadSeq.Add(1))

	gated, err := openGatedRun(cfg, id+"-gated")
	if err != nil {
		return nil, err
	}
	res, err := e.runPhase(ctx, cfg, gated)
	gated.db.Close()
	if err != nil {
		return nil, err
	}
	report.Runs = append(report.Runs, res)
	if cfg.baseline && ctx.Err() == nil {
		base, err := openBaselineRun(cfg, id+"-baseline")
		if err != nil {
			return nil, err
		}
		res, err := e.runPhase(ctx, cfg, base)
		base.db.Close()
		if err != nil && ctx.Err() != nil {
			return report, nil // interrupted before the baseline started
		}
		if err != nil {
			return nil, err
		}
		report.Runs = append(report.Runs, res)
	}
	return report, nil
}

func openGatedRun(cfg *loadConfig, app string) (*loadRun, error) {
	inner, err := cfg.target.GatedConnector(app, false)
	if err != nil {
		return nil, err
	}
	r := &loadRun{name: "gated", app: app}
	r.rec = newRecorder(cfg.deadline)
	g, err := bulkhead.New(inner, cfg.policy, bulkhead.WithEvents(bulkhead.Events{
		OnAdmit: func(ev bulkhead.Event) { r.rec.addWait(ev.Waited) },
	}))
	if err != nil {
		return nil, err
	}
	r.gate, r.db = g, g.OpenDB()
	r.tag = cfg.workload
	r.setup = cli.PolicySetup(cfg.policy, cfg.workload) + cli.AdaptiveSetup(cfg.policy)
	r.gauges = func() (int, int) {
		st := g.Stats()
		return st.Running, st.Waiting
	}
	return r, nil
}

func openBaselineRun(cfg *loadConfig, app string) (*loadRun, error) {
	inner, err := cfg.target.Connector(app, false)
	if err != nil {
		return nil, err
	}
	r := &loadRun{name: "baseline", app: app, rec: newRecorder(cfg.deadline)}
	r.db = sql.OpenDB(inner)
	r.db.SetMaxOpenConns(cfg.maxOpen)
	r.db.SetMaxIdleConns(cfg.maxOpen)
	r.setup = fmt.Sprintf("database/sql MaxOpenConns=%d", cfg.maxOpen)
	// Without the gate: running = connections in use, waiting = the
	// client operations in flight that have none.
	r.gauges = func() (int, int) {
		inUse := r.db.Stats().InUse
		return inUse, max(0, r.rec.inFlight()-inUse)
	}
	return r, nil
}

// runPhase runs the clients of one run and returns what was measured.
func (e *env) runPhase(ctx context.Context, cfg *loadConfig, r *loadRun) (*runResult, error) {
	pingCtx, cancel := context.WithTimeout(ctx, cfg.target.StartTimeout())
	err := r.db.PingContext(pingCtx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("interrupted before the run started")
		}
		return nil, fmt.Errorf("cannot connect to %s: %w", cfg.target.Display, err)
	}
	var mon *serverMonitor
	if cfg.target.Dialect == cli.DialectPostgres {
		mon, err = startMonitor(ctx, cfg.target, r.app)
		if err != nil {
			return nil, err
		}
	}

	op := cli.Operation(cfg.target, cfg.work, cfg.hold, cfg.cpuRows)
	rec := r.rec
	rec.begin(time.Now())
	stopStarting := ctx
	if cfg.duration > 0 {
		var cancel context.CancelFunc
		stopStarting, cancel = context.WithTimeout(ctx, cfg.duration)
		defer cancel()
	}
	var tickets atomic.Int64
	var clients sync.WaitGroup
	for range cfg.clients {
		clients.Go(func() {
			for stopStarting.Err() == nil {
				if cfg.count > 0 && tickets.Add(1) > cfg.count {
					return
				}
				rec.started()
				opCtx, cancel := context.WithTimeout(r.opCtx(ctx), cfg.deadline)
				t0 := time.Now()
				err := op(opCtx, r.db)
				lat := time.Since(t0)
				o := cli.Classify(err, opCtx, ctx)
				cancel()
				rec.ended(o, lat, err)
				if o != cli.OutCompleted && cfg.backoff > 0 {
					_ = cli.Sleep(stopStarting, cfg.backoff) // the loop sees stopStarting end
				}
			}
		})
	}

	// The sampler: gauges for the chart, progress lines, and the monitor's
	// polls, until the clients are done.
	clientsDone := make(chan struct{})
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		e.sample(r, cfg, clientsDone, mon)
	}()
	clients.Wait()
	close(clientsDone)
	<-samplerDone
	if mon != nil {
		mon.Close()
	}

	res := rec.result(r, cfg, ctx.Err() != nil, mon)
	if err := res.checkTotals(); err != nil {
		return nil, err
	}
	return res, nil
}

// sample records gauges every sampleInterval, polls the server monitor,
// and writes progress, until done is closed.
func (e *env) sample(r *loadRun, cfg *loadConfig, done <-chan struct{}, mon *serverMonitor) {
	tty := e.IsTerminal(e.Stderr)
	every := cfg.progress
	if tty && every > 0 {
		every = termRefresh
	}
	tick := time.NewTicker(sampleInterval)
	defer tick.Stop()
	var monTick <-chan time.Time
	if mon != nil {
		t := time.NewTicker(pollInterval)
		defer t.Stop()
		monTick = t.C
		mon.poll(r.rec) // at once, then every pollInterval
	}
	last := time.Now()
	progress := func(final bool) {
		if every <= 0 {
			return
		}
		line := r.rec.progressLine(r.name)
		if tty {
			// One line rewritten in place: never wider than the terminal.
			if w := cli.TerminalWidth(e.Stderr); w > 1 && len(line) >= w {
				line = line[:w-1]
			}
			fmt.Fprintf(e.Stderr, "\r%s\x1b[K", line)
			if final {
				fmt.Fprintln(e.Stderr)
			}
			return
		}
		fmt.Fprintln(e.Stderr, line)
	}
	for {
		select {
		case <-done:
			running, waiting := r.gauges()
			r.rec.gauge(running, waiting)
			if mon != nil {
				mon.poll(r.rec)
			}
			progress(true)
			return
		case <-monTick:
			mon.poll(r.rec)
		case now := <-tick.C:
			running, waiting := r.gauges()
			r.rec.gauge(running, waiting)
			if every > 0 && now.Sub(last) >= every {
				last = now
				progress(false)
			}
		}
	}
}

// serverMonitor polls pg_stat_activity on its own plain connection for
// the transactions and connections of one application_name.
type serverMonitor struct {
	*cli.ActivityDB
	err  error // the first failed poll
	seen bool  // a poll succeeded
}

func startMonitor(ctx context.Context, t *cli.Target, app string) (*serverMonitor, error) {
	a, err := cli.OpenActivityDB(ctx, t, app)
	if err != nil {
		return nil, err
	}
	return &serverMonitor{ActivityDB: a}, nil
}

func (m *serverMonitor) poll(rec *recorder) {
	if m.err != nil {
		return
	}
	tx, conns, err := m.Count()
	if err != nil {
		m.err = err
		return
	}
	m.seen = true
	rec.server(tx, conns)
}

// recorder collects the measurements of one run. Its methods are safe for
// concurrent use.
type recorder struct {
	deadline time.Duration

	mu        sync.Mutex
	start     time.Time
	attempted int64
	inflight  int
	n         [cli.NumOutcomes]int64
	good      int64
	lat       []time.Duration // of completed operations
	waits     []time.Duration // OnAdmit: wait for an execution permit
	errs      map[string]int
	secs      []*second
	last      counts // for progress: gauges at the last sample
	srvTx     int
	srvConns  int
}

type counts struct{ running, waiting int }

// second is what happened in one second of a run.
type second struct {
	n               [cli.NumOutcomes]int
	good            int
	lat             []time.Duration
	samples         int
	runSum, waitSum int
	runMax, waitMax int
	srvTx, srvConns int
	srvSeen         bool
}

func newRecorder(deadline time.Duration) *recorder {
	return &recorder{deadline: deadline, errs: map[string]int{}}
}

func (r *recorder) begin(now time.Time) {
	r.mu.Lock()
	r.start = now
	r.mu.Unlock()
}

// bucketLocked returns the second that now falls in.
func (r *recorder) bucketLocked(now time.Time) *second {
	i := max(0, int(now.Sub(r.start)/time.Second))
	for len(r.secs) <= i {
		r.secs = append(r.secs, &second{})
	}
	return r.secs[i]
}

func (r *recorder) started() {
	r.mu.Lock()
	r.attempted++
	r.inflight++
	r.mu.Unlock()
}

func (r *recorder) inFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inflight
}

func (r *recorder) ended(o cli.Outcome, lat time.Duration, err error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inflight--
	r.n[o]++
	s := r.bucketLocked(now)
	s.n[o]++
	switch o {
	case cli.OutCompleted:
		r.lat = append(r.lat, lat)
		s.lat = append(s.lat, lat)
		if lat <= r.deadline {
			r.good++
			s.good++
		}
	case cli.OutOther:
		cli.AddErrSample(r.errs, err)
	}
}

func (r *recorder) addWait(d time.Duration) {
	r.mu.Lock()
	r.waits = append(r.waits, d)
	r.mu.Unlock()
}

func (r *recorder) gauge(running, waiting int) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.bucketLocked(now)
	s.samples++
	s.runSum += running
	s.waitSum += waiting
	s.runMax = max(s.runMax, running)
	s.waitMax = max(s.waitMax, waiting)
	r.last = counts{running, waiting}
}

func (r *recorder) server(tx, conns int) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.bucketLocked(now)
	s.srvSeen = true
	s.srvTx = max(s.srvTx, tx)
	s.srvConns = max(s.srvConns, conns)
	r.srvTx = max(r.srvTx, tx)
	r.srvConns = max(r.srvConns, conns)
}

func (r *recorder) progressLine(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%-8s %5.1fs  completed %d  rejected full %d  timeout %d  late %d  deadline %d  running %d  waiting %d",
		name, time.Since(r.start).Seconds(), r.n[cli.OutCompleted], r.n[cli.OutRejectedFull], r.n[cli.OutRejectedTimeout],
		r.n[cli.OutRejectedDeadline], r.n[cli.OutDeadline], r.last.running, r.last.waiting)
}

// result summarises the run.
func (r *recorder) result(run *loadRun, cfg *loadConfig, interrupted bool, mon *serverMonitor) *runResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	elapsed := time.Since(r.start)
	res := &runResult{
		Name:             run.name,
		Database:         cfg.target.Display,
		Setup:            run.setup,
		Clients:          cfg.clients,
		Work:             cfg.work,
		HoldMs:           cli.Ms(cfg.hold),
		DeadlineMs:       cli.Ms(cfg.deadline),
		BackoffMs:        cli.Ms(cfg.backoff),
		ElapsedS:         elapsed.Seconds(),
		Interrupted:      interrupted,
		Attempted:        r.attempted,
		Completed:        r.n[cli.OutCompleted],
		WithinDeadline:   r.good,
		RejectedFull:     r.n[cli.OutRejectedFull],
		RejectedTimeout:  r.n[cli.OutRejectedTimeout],
		RejectedDeadline: r.n[cli.OutRejectedDeadline],
		DeadlineExceeded: r.n[cli.OutDeadline],
		InterruptedOps:   r.n[cli.OutInterrupted],
		OtherErrors:      r.n[cli.OutOther],
		Latency:          cli.Percentiles(r.lat),
	}
	if len(r.errs) > 0 {
		res.ErrorSamples = maps.Clone(r.errs)
	}
	if s := elapsed.Seconds(); s > 0 {
		res.ThroughputPerS = float64(res.Completed) / s
		res.GoodputPerS = float64(res.WithinDeadline) / s
	}
	if run.gate != nil {
		p := cfg.policy
		res.Policy = &cli.PolicyJSON{MaxConcurrent: p.MaxConcurrent, MaxQueue: p.MaxQueue, QueueWaitMs: cli.Ms(p.QueueWait), DryRun: p.DryRun,
			Adaptive: p.Adaptive, MinConcurrent: cli.MinConcurrent(p)}
		if w := cli.Percentiles(r.waits); w != nil {
			res.QueueWaitP99Ms = &w.P99
		}
		st := run.gate.Stats()
		res.Gate = &gateJSON{
			Admitted: st.Admitted, RejectedFull: st.RejectedFull, RejectedTimeout: st.RejectedTimeout, RejectedDeadline: st.RejectedDeadline,
			ConnectFailed: st.ConnectFailed, Canceled: st.Canceled, WaitCount: st.WaitCount,
			OpenConns: st.OpenConns, Dials: st.Dials, DialErrors: st.DialErrors, DryRun: st.DryRun, WouldWait: st.WouldWait,
		}
		if run.tag != "" {
			res.Workload = run.tag
		}
	} else {
		res.MaxOpenConns = cfg.maxOpen
	}
	ds := run.db.Stats()
	res.PoolOpenConns = ds.OpenConnections
	res.PoolWaitCount = ds.WaitCount
	if ds.WaitCount > 0 {
		res.PoolWaitMeanMs = cli.Ms(ds.WaitDuration / time.Duration(ds.WaitCount))
	}
	if mon != nil {
		if mon.seen {
			tx, conns := r.srvTx, r.srvConns
			res.ServerMaxTransactions, res.ServerMaxConnections = &tx, &conns
		}
		if mon.err != nil {
			res.ServerMonitorError = cli.OneLine(mon.err)
		}
	}
	secs, lengths := r.buckets(elapsed)
	for i, s := range secs {
		sj := secondJSON{
			T:                i,
			LengthS:          lengths[i],
			Completed:        s.n[cli.OutCompleted],
			WithinDeadline:   s.good,
			RejectedFull:     s.n[cli.OutRejectedFull],
			RejectedTimeout:  s.n[cli.OutRejectedTimeout],
			RejectedDeadline: s.n[cli.OutRejectedDeadline],
			Deadline:         s.n[cli.OutDeadline],
			Interrupted:      s.n[cli.OutInterrupted],
			Other:            s.n[cli.OutOther],
			RunningMax:       s.runMax,
			WaitingMax:       s.waitMax,
			Latency:          cli.Percentiles(s.lat),
		}
		if s.samples > 0 {
			sj.Running = float64(s.runSum) / float64(s.samples)
			sj.Waiting = float64(s.waitSum) / float64(s.samples)
		}
		if s.srvSeen {
			tx, conns := s.srvTx, s.srvConns
			sj.ServerTx, sj.ServerConns = &tx, &conns
		}
		res.Seconds = append(res.Seconds, sj)
	}
	return res
}

// buckets returns the seconds of the run and the length of each: one
// second, except the last, which ends with the run. A last bucket shorter
// than half a second (the operations in flight when the clients stopped
// starting new ones) is merged into the one before, so that its rates are
// not computed over a sliver of time.
func (r *recorder) buckets(elapsed time.Duration) ([]*second, []float64) {
	secs := slices.Clone(r.secs)
	n := len(secs)
	if n == 0 {
		return nil, nil
	}
	lengths := make([]float64, n)
	for i := range lengths {
		lengths[i] = 1
	}
	lengths[n-1] = max(elapsed.Seconds()-float64(n-1), 0.001)
	if n >= 2 && lengths[n-1] < 0.5 {
		a, b := *secs[n-2], secs[n-1]
		for o := range a.n {
			a.n[o] += b.n[o]
		}
		a.good += b.good
		a.lat = append(slices.Clip(a.lat), b.lat...)
		a.samples += b.samples
		a.runSum += b.runSum
		a.waitSum += b.waitSum
		a.runMax = max(a.runMax, b.runMax)
		a.waitMax = max(a.waitMax, b.waitMax)
		a.srvTx = max(a.srvTx, b.srvTx)
		a.srvConns = max(a.srvConns, b.srvConns)
		a.srvSeen = a.srvSeen || b.srvSeen
		secs[n-2] = &a
		lengths[n-2] += lengths[n-1]
		secs, lengths = secs[:n-1], lengths[:n-1]
	}
	return secs, lengths
}

// The results, as written by --json.
type (
	loadReport struct {
		cfg  *loadConfig
		Runs []*runResult `json:"runs"`
	}
	runResult struct {
		Name                  string          `json:"name"`
		Database              string          `json:"database"`
		Setup                 string          `json:"setup"`
		Policy                *cli.PolicyJSON `json:"policy,omitempty"`
		MaxOpenConns          int             `json:"max_open_conns,omitempty"`
		Clients               int             `json:"clients"`
		Work                  string          `json:"work"`
		HoldMs                float64         `json:"hold_ms"`
		DeadlineMs            float64         `json:"deadline_ms"`
		BackoffMs             float64         `json:"backoff_ms"`
		ElapsedS              float64         `json:"elapsed_s"`
		Interrupted           bool            `json:"interrupted"`
		Attempted             int64           `json:"attempted"`
		Completed             int64           `json:"completed"`
		WithinDeadline        int64           `json:"within_deadline"`
		RejectedFull          int64           `json:"rejected_full"`
		RejectedTimeout       int64           `json:"rejected_timeout"`
		RejectedDeadline      int64           `json:"rejected_deadline"` // refused: it would have missed its deadline
		DeadlineExceeded      int64           `json:"deadline_exceeded"`
		InterruptedOps        int64           `json:"interrupted_ops"`
		OtherErrors           int64           `json:"other_errors"`
		ErrorSamples          map[string]int  `json:"error_samples,omitempty"`
		ThroughputPerS        float64         `json:"throughput_per_s"`
		GoodputPerS           float64         `json:"goodput_per_s"`
		Latency               *cli.Pct        `json:"latency_ms"`
		QueueWaitP99Ms        *float64        `json:"queue_wait_p99_ms,omitempty"`
		PoolOpenConns         int             `json:"pool_open_conns"` // database/sql's connections open as the run ended
		PoolWaitCount         int64           `json:"pool_wait_count"`
		PoolWaitMeanMs        float64         `json:"pool_wait_mean_ms"`
		ServerMaxTransactions *int            `json:"server_max_transactions,omitempty"`
		ServerMaxConnections  *int            `json:"server_max_connections,omitempty"`
		ServerMonitorError    string          `json:"server_monitor_error,omitempty"`
		Gate                  *gateJSON       `json:"gate,omitempty"`
		Workload              string          `json:"workload,omitempty"` // the workload the operations named
		Seconds               []secondJSON    `json:"seconds"`
	}
	gateJSON struct {
		Admitted         int64 `json:"admitted"`
		RejectedFull     int64 `json:"rejected_full"`
		RejectedTimeout  int64 `json:"rejected_timeout"`
		RejectedDeadline int64 `json:"rejected_deadline"`
		ConnectFailed    int64 `json:"connect_failed"` // had their permits, then no server connection: the dial failed
		Canceled         int64 `json:"canceled"`
		WaitCount        int64 `json:"wait_count"`
		OpenConns        int   `json:"open_conns"`           // server connections open as the run ended
		Dials            int64 `json:"dials"`                // server connections dialed, failed dials included
		DialErrors       int64 `json:"dial_errors"`          // of which failed
		DryRun           bool  `json:"dry_run,omitempty"`    // rejections counted, not enforced
		WouldWait        int64 `json:"would_wait,omitempty"` // dry-run: found no permit free, ran anyway
	}
	secondJSON struct {
		T                int      `json:"t"`        // the bucket starts T seconds into the run
		LengthS          float64  `json:"length_s"` // and lasts this long (1, except the last)
		Completed        int      `json:"completed"`
		WithinDeadline   int      `json:"within_deadline"`
		RejectedFull     int      `json:"rejected_full"`
		RejectedTimeout  int      `json:"rejected_timeout"`
		RejectedDeadline int      `json:"rejected_deadline"`
		Deadline         int      `json:"deadline_exceeded"`
		Interrupted      int      `json:"interrupted"`
		Other            int      `json:"other_errors"`
		Running          float64  `json:"running_mean"`
		Waiting          float64  `json:"waiting_mean"`
		RunningMax       int      `json:"running_max"`
		WaitingMax       int      `json:"waiting_max"`
		Latency          *cli.Pct `json:"latency_ms,omitempty"`
		ServerTx         *int     `json:"server_transactions,omitempty"`
		ServerConns      *int     `json:"server_connections,omitempty"`
	}
)

// failed is the number of operations that did not complete.
func (r *runResult) failed() int64 {
	return r.RejectedFull + r.RejectedTimeout + r.RejectedDeadline + r.DeadlineExceeded + r.InterruptedOps + r.OtherErrors
}

// checkTotals asserts that every attempted operation is counted once, in
// the totals and in the per-second counts.
func (r *runResult) checkTotals() error {
	if r.Attempted != r.Completed+r.failed() {
		return fmt.Errorf("internal error: %s: attempted %d != completed %d + failed %d", r.Name, r.Attempted, r.Completed, r.failed())
	}
	var sum int64
	for _, s := range r.Seconds {
		sum += int64(s.Completed + s.RejectedFull + s.RejectedTimeout + s.RejectedDeadline + s.Deadline + s.Interrupted + s.Other)
	}
	if sum != r.Attempted {
		return fmt.Errorf("internal error: %s: per-second outcomes add up to %d, attempted %d", r.Name, sum, r.Attempted)
	}
	return nil
}

func (rep *loadReport) printTable(w io.Writer) {
	cfg := rep.cfg
	limit := fmt.Sprintf("for %v", cfg.duration)
	if cfg.count > 0 {
		limit = fmt.Sprintf("%d operations", cfg.count)
		if cfg.duration > 0 {
			limit += fmt.Sprintf(" or %v", cfg.duration)
		}
	}
	fmt.Fprintf(w, "\nload on %s: %d clients %s, each operation %s\n\n", cfg.target.Display, cfg.clients, limit, rep.operation())
	// Numbers align right; labels, padded to one width here, stay left.
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', tabwriter.AlignRight)
	row := func(label string, f func(r *runResult) string) {
		fmt.Fprintf(tw, "%-29s\t", label)
		for _, r := range rep.Runs {
			fmt.Fprintf(tw, "%s\t", f(r))
		}
		fmt.Fprintln(tw)
	}
	num := func(f func(r *runResult) int64) func(*runResult) string {
		return func(r *runResult) string { return fmt.Sprint(f(r)) }
	}
	lat := func(f func(p *cli.Pct) float64) func(*runResult) string {
		return func(r *runResult) string {
			if r.Latency == nil {
				return "-"
			}
			return fmt.Sprintf("%.1f ms", f(r.Latency))
		}
	}
	row("", func(r *runResult) string { return r.Name })
	row("setup", func(r *runResult) string { return r.Setup })
	row("elapsed", func(r *runResult) string {
		s := fmt.Sprintf("%.1f s", r.ElapsedS)
		if r.Interrupted {
			s += " (interrupted)"
		}
		return s
	})
	row("attempted", num(func(r *runResult) int64 { return r.Attempted }))
	row("completed", num(func(r *runResult) int64 { return r.Completed }))
	row("  within deadline", num(func(r *runResult) int64 { return r.WithinDeadline }))
	row("rejected: admission full", num(func(r *runResult) int64 { return r.RejectedFull }))
	row("rejected: queue timeout", num(func(r *runResult) int64 { return r.RejectedTimeout }))
	row("rejected: would miss deadline", num(func(r *runResult) int64 { return r.RejectedDeadline }))
	if slices.ContainsFunc(rep.Runs, func(r *runResult) bool { return r.Gate != nil && r.Gate.DryRun }) {
		dry := func(f func(g *gateJSON) int64) func(*runResult) string {
			return func(r *runResult) string {
				if r.Gate == nil || !r.Gate.DryRun {
					return "-"
				}
				return fmt.Sprint(f(r.Gate))
			}
		}
		row("dry run: would reject full", dry(func(g *gateJSON) int64 { return g.RejectedFull }))
		row("dry run: would wait", dry(func(g *gateJSON) int64 { return g.WouldWait }))
	}
	row("deadline exceeded", num(func(r *runResult) int64 { return r.DeadlineExceeded }))
	row("interrupted", num(func(r *runResult) int64 { return r.InterruptedOps }))
	row("other errors", num(func(r *runResult) int64 { return r.OtherErrors }))
	row("throughput", func(r *runResult) string { return fmt.Sprintf("%.1f/s", r.ThroughputPerS) })
	row("goodput (within deadline)", func(r *runResult) string { return fmt.Sprintf("%.1f/s", r.GoodputPerS) })
	row("latency p50", lat(func(p *cli.Pct) float64 { return p.P50 }))
	row("latency p95", lat(func(p *cli.Pct) float64 { return p.P95 }))
	row("latency p99", lat(func(p *cli.Pct) float64 { return p.P99 }))
	row("queue wait p99 (gate)", func(r *runResult) string {
		if r.QueueWaitP99Ms == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f ms", *r.QueueWaitP99Ms)
	})
	row("pool waits (database/sql)", func(r *runResult) string {
		if r.PoolWaitCount == 0 {
			return "0"
		}
		return fmt.Sprintf("%d, mean %.1f ms", r.PoolWaitCount, r.PoolWaitMeanMs)
	})
	if cfg.target.Dialect == cli.DialectPostgres {
		server := func(f func(r *runResult) *int) func(*runResult) string {
			return func(r *runResult) string {
				if v := f(r); v != nil {
					return fmt.Sprint(*v)
				}
				return "-"
			}
		}
		row("server: most transactions", server(func(r *runResult) *int { return r.ServerMaxTransactions }))
		row("server: most connections", server(func(r *runResult) *int { return r.ServerMaxConnections }))
	}
	tw.Flush()
	fmt.Fprintln(w)
	if cfg.baseline && len(rep.Runs) == 1 {
		fmt.Fprintln(w, "baseline: not run, the load was interrupted")
	}
	for _, r := range rep.Runs {
		fmt.Fprintf(w, "%s: attempted %d = completed %d + rejected %d + deadline exceeded %d + interrupted %d + other %d\n",
			r.Name, r.Attempted, r.Completed, r.RejectedFull+r.RejectedTimeout+r.RejectedDeadline, r.DeadlineExceeded, r.InterruptedOps, r.OtherErrors)
		if r.ServerMonitorError != "" {
			fmt.Fprintf(w, "%s: pg_stat_activity monitor stopped: %s\n", r.Name, r.ServerMonitorError)
		}
		keys := make([]string, 0, len(r.ErrorSamples))
		for k := range r.ErrorSamples {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "%s: other error ×%d: %s\n", r.Name, r.ErrorSamples[k], k)
		}
	}
}

// operation describes one client operation of the load.
func (rep *loadReport) operation() string {
	cfg := rep.cfg
	what := fmt.Sprintf("a transaction holding the database %v", cfg.hold)
	if cfg.work == "cpu" {
		what = fmt.Sprintf("a CPU-bound query over %d rows", cfg.cpuRows)
	}
	return fmt.Sprintf("%s, deadline %v, backoff %v", what, cfg.deadline, cfg.backoff)
}

// describe is the chart's caption.
func (rep *loadReport) describe() string {
	cfg := rep.cfg
	return fmt.Sprintf("%s, %d clients; each operation %s", cfg.target.Dialect.Title(), cfg.clients, rep.operation())
}
