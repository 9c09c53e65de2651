package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

const loadUsage = `Usage: bulkhead load [--dsn URL] [--clients N] [--duration D | --count N] [flags]

The overload experiment. N clients run operations back to back, each a
transaction that holds the database for --hold (pg_sleep on PostgreSQL,
SLEEP on MySQL, an open transaction on the embedded SQLite) or does
CPU-bound work (--work cpu), with a deadline per operation (--deadline),
through the gate (--max-concurrent B, --max-queue Q, --queue-wait; the
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
	maxClients     = 10_000
	maxLoadLength  = 24 * time.Hour
	sampleInterval = 50 * time.Millisecond // gauges for the chart
	pollInterval   = 20 * time.Millisecond // pg_stat_activity
	termRefresh    = 250 * time.Millisecond
	maxErrSamples  = 10
)

// loadConfig is a validated load command line.
type loadConfig struct {
	target   *target
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
	chart    string
	jsonOut  string
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
			fmt.Fprintln(e.stderr, "bulkhead: load: interrupted before anything was measured")
			return exitInterrupted
		}
		return e.fail(fmt.Errorf("load: %w", err))
	}
	chart := func(path string) error { return writeChart(path, report) }
	return e.report(ctx, "load", cfg.jsonOut, cfg.chart, true, report.printTable, chart, report)
}

// policySetup describes the gate of a run: its policy, dry-run and the
// workload its operations name.
func policySetup(p bulkhead.Policy, workload string) string {
	s := fmt.Sprintf("B=%d Q=%d wait=%v", p.MaxConcurrent, p.MaxQueue, p.QueueWait)
	if workload != "" {
		w := p.Workloads[workload]
		s += fmt.Sprintf(" workload %s B=%d Q=%d wait=%v", workload, w.MaxConcurrent, w.MaxQueue, w.QueueWait)
	}
	if p.DryRun {
		s += " dry-run"
	}
	return s
}

// checkWorkload checks --workload against the policy's workloads: a name
// it lists, and workloads given by flag only with --workload (they would
// do nothing: no operation would name them).
func checkWorkload(r *resolvedPolicy, workload string, set map[string]bool) error {
	names := workloadNames(r.p)
	switch {
	case workload != "" && len(names) == 0:
		return fmt.Errorf("--workload %q names no workload: the policy has none; want --workloads or %s with it", workload, bulkhead.EnvWorkloads)
	case workload != "" && r.p.Workloads[workload] == (bulkhead.Workload{}):
		return fmt.Errorf("--workload %q is not a workload of the policy; want one of %s", workload, strings.Join(names, ", "))
	case workload == "" && set[setWorkloads] && len(names) > 0:
		return fmt.Errorf("--workloads does nothing without --workload: no operation would name a workload; want --workload NAME too")
	}
	return nil
}

func (e *env) parseLoad(args []string) (*loadConfig, int, bool) {
	fs := e.newFlagSet("load", loadUsage, loadExamples)
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
	chart := fs.String("chart", "", "write a chart of the run(s) to this .svg file (SVG only)")
	jsonOut := fs.String("json", "", "write the results as JSON to this file (- for stdout; the table then goes to stderr)")
	workload := fs.String("workload", "", "tag the gated run's operations with this workload of the policy (--workloads)")
	pi := e.addPolicyFlags(fs, unusedSettings["load"])
	if code, done := e.parseFlags(fs, args); done {
		return nil, code, true
	}
	set := flagsSet(fs)
	bad := func(format string, a ...any) (*loadConfig, int, bool) {
		return nil, e.fail(fmt.Errorf("load: "+format, a...)), true
	}
	cfg := &loadConfig{
		clients: *clients, duration: *duration, count: *count, work: *work, cpuRows: *cpuRows, hold: *hold,
		deadline: *deadline, baseline: *baseline, maxOpen: *maxOpen, backoff: *backoff,
		progress: *progress, chart: *chart, jsonOut: *jsonOut,
	}
	switch {
	case cfg.clients < 1 || cfg.clients > maxClients:
		return bad("--clients is %d, want 1 to %d", cfg.clients, maxClients)
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
	if cfg.chart != "" {
		if err := checkChartPath(cfg.chart); err != nil {
			return bad("%w", err)
		}
	}
	if cfg.jsonOut != "" && cfg.jsonOut != "-" {
		if err := checkDir(cfg.jsonOut); err != nil {
			return bad("--json %q: %v", cfg.jsonOut, err)
		}
	}
	r, err := pi.resolve(e.lookup, set, bulkhead.DefaultPolicy)
	if err == nil {
		err = r.check()
	}
	if err == nil {
		err = checkWorkload(r, *workload, set)
	}
	if err != nil {
		return bad("%w", err)
	}
	p := r.p
	cfg.policy, cfg.workload = p, *workload
	if cfg.maxOpen == 0 {
		cfg.maxOpen = p.MaxConcurrent
	}
	t, err := e.resolveTarget(*dsn, set["dsn"])
	if err != nil {
		return bad("%w", err)
	}
	cfg.target = t
	return cfg, exitOK, false
}

// checkDir reports whether the directory of path exists, so that a run
// does not end with nowhere to write its results.
func checkDir(path string) error {
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("directory %s does not exist", dir)
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	return nil
}

// outcome is how an operation ended. Every attempted operation ends in
// exactly one.
type outcome int

const (
	outCompleted outcome = iota
	outRejectedFull
	outRejectedTimeout
	outDeadline
	outInterrupted
	outOther
	numOutcomes
)

// classify decides an operation's outcome from its error and contexts.
func classify(err error, opCtx, runCtx context.Context) outcome {
	switch {
	case err == nil:
		return outCompleted
	case errors.Is(err, bulkhead.ErrAdmissionFull):
		return outRejectedFull
	case errors.Is(err, bulkhead.ErrQueueTimeout):
		return outRejectedTimeout
	case runCtx.Err() != nil:
		return outInterrupted
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(opCtx.Err(), context.DeadlineExceeded):
		return outDeadline
	}
	return outOther
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
	inner, err := cfg.target.gatedConnector(app, false)
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
	r.setup = policySetup(cfg.policy, cfg.workload)
	r.gauges = func() (int, int) {
		st := g.Stats()
		return st.Running, st.Waiting
	}
	return r, nil
}

func openBaselineRun(cfg *loadConfig, app string) (*loadRun, error) {
	inner, err := cfg.target.connector(app, false)
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
	pingCtx, cancel := context.WithTimeout(ctx, cfg.target.startTimeout())
	err := r.db.PingContext(pingCtx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("interrupted before the run started")
		}
		return nil, fmt.Errorf("cannot connect to %s: %w", cfg.target.display, err)
	}
	var mon *serverMonitor
	if cfg.target.dialect == dialectPostgres {
		mon, err = startMonitor(ctx, cfg.target, r.app)
		if err != nil {
			return nil, err
		}
	}

	op := cfg.operation()
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
				o := classify(err, opCtx, ctx)
				cancel()
				rec.ended(o, lat, err)
				if o != outCompleted && cfg.backoff > 0 {
					pause(stopStarting, cfg.backoff)
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
		mon.close()
	}

	res := rec.result(r, cfg, ctx.Err() != nil, mon)
	if err := res.checkTotals(); err != nil {
		return nil, err
	}
	return res, nil
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// sample records gauges every sampleInterval, polls the server monitor,
// and writes progress, until done is closed.
func (e *env) sample(r *loadRun, cfg *loadConfig, done <-chan struct{}, mon *serverMonitor) {
	tty := e.isTerminal(e.stderr)
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
			if w := terminalWidth(e.stderr); w > 1 && len(line) >= w {
				line = line[:w-1]
			}
			fmt.Fprintf(e.stderr, "\r%s\x1b[K", line)
			if final {
				fmt.Fprintln(e.stderr)
			}
			return
		}
		fmt.Fprintln(e.stderr, line)
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

// operation returns what one client operation does on the target.
func (cfg *loadConfig) operation() func(ctx context.Context, db *sql.DB) error {
	d := cfg.target.dialect
	hold := cfg.hold
	var body func(ctx context.Context, tx *sql.Tx) error
	switch {
	case cfg.work == "cpu" && d == dialectPostgres:
		body = scanOne(fmt.Sprintf("SELECT sum(i) FROM generate_series(1, %d) i", cfg.cpuRows))
	case cfg.work == "cpu" && d == dialectMySQL:
		body = scanOne(fmt.Sprintf("SELECT BENCHMARK(%d, MD5('bulkhead'))", 3*cfg.cpuRows))
	case cfg.work == "cpu":
		body = scanOne(fmt.Sprintf("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < %d) SELECT sum(i) FROM s", cfg.cpuRows))
	case d == dialectPostgres:
		body = func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "SELECT pg_sleep($1)", hold.Seconds())
			return err
		}
	case d == dialectMySQL:
		body = scanOne("SELECT SLEEP(?)", hold.Seconds())
	default:
		// SQLite: a transaction that has run a statement, held open.
		one := scanOne("SELECT 1")
		body = func(ctx context.Context, tx *sql.Tx) error {
			if err := one(ctx, tx); err != nil {
				return err
			}
			t := time.NewTimer(hold)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return func(ctx context.Context, db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := body(ctx, tx); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	}
}

func scanOne(query string, args ...any) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		var v sql.NullInt64
		return tx.QueryRowContext(ctx, query, args...).Scan(&v)
	}
}

// serverMonitor polls pg_stat_activity on its own plain connection for
// the transactions and connections of one application_name.
type serverMonitor struct {
	*activityDB
	err  error // the first failed poll
	seen bool  // a poll succeeded
}

func startMonitor(ctx context.Context, t *target, app string) (*serverMonitor, error) {
	a, err := openActivityDB(ctx, t, app)
	if err != nil {
		return nil, err
	}
	return &serverMonitor{activityDB: a}, nil
}

func (m *serverMonitor) poll(rec *recorder) {
	if m.err != nil {
		return
	}
	tx, conns, err := m.count()
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
	n         [numOutcomes]int64
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
	n               [numOutcomes]int
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

func (r *recorder) ended(o outcome, lat time.Duration, err error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inflight--
	r.n[o]++
	s := r.bucketLocked(now)
	s.n[o]++
	switch o {
	case outCompleted:
		r.lat = append(r.lat, lat)
		s.lat = append(s.lat, lat)
		if lat <= r.deadline {
			r.good++
			s.good++
		}
	case outOther:
		msg := strings.Join(strings.Fields(err.Error()), " ")
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		if _, ok := r.errs[msg]; ok || len(r.errs) < maxErrSamples {
			r.errs[msg]++
		}
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
	return fmt.Sprintf("%-8s %5.1fs  completed %d  rejected full %d  timeout %d  deadline %d  running %d  waiting %d",
		name, time.Since(r.start).Seconds(), r.n[outCompleted], r.n[outRejectedFull], r.n[outRejectedTimeout],
		r.n[outDeadline], r.last.running, r.last.waiting)
}

// result summarises the run.
func (r *recorder) result(run *loadRun, cfg *loadConfig, interrupted bool, mon *serverMonitor) *runResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	elapsed := time.Since(r.start)
	res := &runResult{
		Name:             run.name,
		Database:         cfg.target.display,
		Setup:            run.setup,
		Clients:          cfg.clients,
		Work:             cfg.work,
		HoldMs:           ms(cfg.hold),
		DeadlineMs:       ms(cfg.deadline),
		BackoffMs:        ms(cfg.backoff),
		ElapsedS:         elapsed.Seconds(),
		Interrupted:      interrupted,
		Attempted:        r.attempted,
		Completed:        r.n[outCompleted],
		WithinDeadline:   r.good,
		RejectedFull:     r.n[outRejectedFull],
		RejectedTimeout:  r.n[outRejectedTimeout],
		DeadlineExceeded: r.n[outDeadline],
		InterruptedOps:   r.n[outInterrupted],
		OtherErrors:      r.n[outOther],
		Latency:          percentiles(r.lat),
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
		res.Policy = &policyJSON{MaxConcurrent: p.MaxConcurrent, MaxQueue: p.MaxQueue, QueueWaitMs: ms(p.QueueWait), DryRun: p.DryRun}
		if w := percentiles(r.waits); w != nil {
			res.QueueWaitP99Ms = &w.P99
		}
		st := run.gate.Stats()
		res.Gate = &gateJSON{
			Admitted: st.Admitted, RejectedFull: st.RejectedFull, RejectedTimeout: st.RejectedTimeout,
			RejectedNoConn: st.RejectedNoConn, Canceled: st.Canceled, WaitCount: st.WaitCount,
			MaxConns: st.MaxConns, DryRun: st.DryRun, WouldWait: st.WouldWait,
		}
		if run.tag != "" {
			res.Workload = run.tag
		}
	} else {
		res.MaxOpenConns = cfg.maxOpen
	}
	ds := run.db.Stats()
	res.PoolWaitCount = ds.WaitCount
	if ds.WaitCount > 0 {
		res.PoolWaitMeanMs = ms(ds.WaitDuration / time.Duration(ds.WaitCount))
	}
	if mon != nil {
		if mon.seen {
			tx, conns := r.srvTx, r.srvConns
			res.ServerMaxTransactions, res.ServerMaxConnections = &tx, &conns
		}
		if mon.err != nil {
			res.ServerMonitorError = oneLine(mon.err)
		}
	}
	secs, lengths := r.buckets(elapsed)
	for i, s := range secs {
		sj := secondJSON{
			T:               i,
			LengthS:         lengths[i],
			Completed:       s.n[outCompleted],
			WithinDeadline:  s.good,
			RejectedFull:    s.n[outRejectedFull],
			RejectedTimeout: s.n[outRejectedTimeout],
			Deadline:        s.n[outDeadline],
			Interrupted:     s.n[outInterrupted],
			Other:           s.n[outOther],
			RunningMax:      s.runMax,
			WaitingMax:      s.waitMax,
			Latency:         percentiles(s.lat),
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

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentiles returns p50, p95 and p99 (nearest rank) of ds in
// milliseconds, or nil when ds is empty.
func percentiles(ds []time.Duration) *pct {
	if len(ds) == 0 {
		return nil
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return ms(s[min(max(i, 0), len(s)-1)])
	}
	return &pct{P50: at(0.50), P95: at(0.95), P99: at(0.99)}
}

// The results, as written by --json.
type (
	loadReport struct {
		cfg  *loadConfig
		Runs []*runResult `json:"runs"`
	}
	runResult struct {
		Name                  string         `json:"name"`
		Database              string         `json:"database"`
		Setup                 string         `json:"setup"`
		Policy                *policyJSON    `json:"policy,omitempty"`
		MaxOpenConns          int            `json:"max_open_conns,omitempty"`
		Clients               int            `json:"clients"`
		Work                  string         `json:"work"`
		HoldMs                float64        `json:"hold_ms"`
		DeadlineMs            float64        `json:"deadline_ms"`
		BackoffMs             float64        `json:"backoff_ms"`
		ElapsedS              float64        `json:"elapsed_s"`
		Interrupted           bool           `json:"interrupted"`
		Attempted             int64          `json:"attempted"`
		Completed             int64          `json:"completed"`
		WithinDeadline        int64          `json:"within_deadline"`
		RejectedFull          int64          `json:"rejected_full"`
		RejectedTimeout       int64          `json:"rejected_timeout"`
		DeadlineExceeded      int64          `json:"deadline_exceeded"`
		InterruptedOps        int64          `json:"interrupted_ops"`
		OtherErrors           int64          `json:"other_errors"`
		ErrorSamples          map[string]int `json:"error_samples,omitempty"`
		ThroughputPerS        float64        `json:"throughput_per_s"`
		GoodputPerS           float64        `json:"goodput_per_s"`
		Latency               *pct           `json:"latency_ms"`
		QueueWaitP99Ms        *float64       `json:"queue_wait_p99_ms,omitempty"`
		PoolWaitCount         int64          `json:"pool_wait_count"`
		PoolWaitMeanMs        float64        `json:"pool_wait_mean_ms"`
		ServerMaxTransactions *int           `json:"server_max_transactions,omitempty"`
		ServerMaxConnections  *int           `json:"server_max_connections,omitempty"`
		ServerMonitorError    string         `json:"server_monitor_error,omitempty"`
		Gate                  *gateJSON      `json:"gate,omitempty"`
		Workload              string         `json:"workload,omitempty"` // the workload the operations named
		Seconds               []secondJSON   `json:"seconds"`
	}
	pct struct {
		P50 float64 `json:"p50"`
		P95 float64 `json:"p95"`
		P99 float64 `json:"p99"`
	}
	policyJSON struct {
		MaxConcurrent int     `json:"max_concurrent"`
		MaxQueue      int     `json:"max_queue"`
		QueueWaitMs   float64 `json:"queue_wait_ms"`
		DryRun        bool    `json:"dry_run,omitempty"`
	}
	gateJSON struct {
		Admitted        int64 `json:"admitted"`
		RejectedFull    int64 `json:"rejected_full"`
		RejectedTimeout int64 `json:"rejected_timeout"`
		Canceled        int64 `json:"canceled"`
		RejectedNoConn  int64 `json:"rejected_no_connection"`
		WaitCount       int64 `json:"wait_count"`
		MaxConns        int   `json:"max_conns"`
		DryRun          bool  `json:"dry_run,omitempty"`    // rejections counted, not enforced
		WouldWait       int64 `json:"would_wait,omitempty"` // dry-run: found no permit free, ran anyway
	}
	secondJSON struct {
		T               int     `json:"t"`        // the bucket starts T seconds into the run
		LengthS         float64 `json:"length_s"` // and lasts this long (1, except the last)
		Completed       int     `json:"completed"`
		WithinDeadline  int     `json:"within_deadline"`
		RejectedFull    int     `json:"rejected_full"`
		RejectedTimeout int     `json:"rejected_timeout"`
		Deadline        int     `json:"deadline_exceeded"`
		Interrupted     int     `json:"interrupted"`
		Other           int     `json:"other_errors"`
		Running         float64 `json:"running_mean"`
		Waiting         float64 `json:"waiting_mean"`
		RunningMax      int     `json:"running_max"`
		WaitingMax      int     `json:"waiting_max"`
		Latency         *pct    `json:"latency_ms,omitempty"`
		ServerTx        *int    `json:"server_transactions,omitempty"`
		ServerConns     *int    `json:"server_connections,omitempty"`
	}
)

// failed is the number of operations that did not complete.
func (r *runResult) failed() int64 {
	return r.RejectedFull + r.RejectedTimeout + r.DeadlineExceeded + r.InterruptedOps + r.OtherErrors
}

// checkTotals asserts that every attempted operation is counted once, in
// the totals and in the per-second counts.
func (r *runResult) checkTotals() error {
	if r.Attempted != r.Completed+r.failed() {
		return fmt.Errorf("internal error: %s: attempted %d != completed %d + failed %d", r.Name, r.Attempted, r.Completed, r.failed())
	}
	var sum int64
	for _, s := range r.Seconds {
		sum += int64(s.Completed + s.RejectedFull + s.RejectedTimeout + s.Deadline + s.Interrupted + s.Other)
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
	fmt.Fprintf(w, "\nload on %s: %d clients %s, each operation %s\n\n", cfg.target.display, cfg.clients, limit, rep.operation())
	// Numbers align right; labels, padded to one width here, stay left.
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', tabwriter.AlignRight)
	row := func(label string, f func(r *runResult) string) {
		fmt.Fprintf(tw, "%-26s\t", label)
		for _, r := range rep.Runs {
			fmt.Fprintf(tw, "%s\t", f(r))
		}
		fmt.Fprintln(tw)
	}
	num := func(f func(r *runResult) int64) func(*runResult) string {
		return func(r *runResult) string { return fmt.Sprint(f(r)) }
	}
	lat := func(f func(p *pct) float64) func(*runResult) string {
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
	row("latency p50", lat(func(p *pct) float64 { return p.P50 }))
	row("latency p95", lat(func(p *pct) float64 { return p.P95 }))
	row("latency p99", lat(func(p *pct) float64 { return p.P99 }))
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
	if cfg.target.dialect == dialectPostgres {
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
			r.Name, r.Attempted, r.Completed, r.RejectedFull+r.RejectedTimeout, r.DeadlineExceeded, r.InterruptedOps, r.OtherErrors)
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
	return fmt.Sprintf("%s, %d clients; each operation %s", cfg.target.dialect.title(), cfg.clients, rep.operation())
}

// report ends load, overload and fleet: it prints the table (on stderr
// when the JSON goes to stdout), draws the chart to chart if given and
// something was measured, and writes v as JSON to jsonOut if given.
func (e *env) report(ctx context.Context, cmd, jsonOut, chart string, measured bool, table func(io.Writer), draw func(path string) error, v any) int {
	out := e.stdout
	if jsonOut == "-" {
		out = e.stderr
	}
	table(out)
	if chart != "" && measured {
		if err := draw(chart); err != nil {
			return e.fail(fmt.Errorf("%s: --chart %s: %w", cmd, chart, err))
		}
		fmt.Fprintf(out, "chart written to %s\n", chart)
	}
	if jsonOut != "" {
		if err := writeJSON(jsonOut, e.stdout, v); err != nil {
			return e.fail(fmt.Errorf("%s: --json %s: %w", cmd, jsonOut, err))
		}
	}
	return interrupted(ctx, exitOK)
}

// writeJSON writes v as indented JSON to the file path, or to stdout for
// "-".
func writeJSON(path string, stdout io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
