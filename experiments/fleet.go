package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/fleet"
)

const fleetUsage = `Usage: experiments fleet --dsn postgres://... [--arms one,static4,static8,fleet,pgbouncer] [flags]

The fleet experiment: several processes of one service, each a
member started as this same program, share one PostgreSQL database whose
budget is T transactions at once (--max-concurrent, 8 by default). Each arm
runs the same schedule:

  start       N members start (--members); its row shows the shares
              settling (--warmup long)
  steady      N members, --phase long
  deploy      a rolling deploy: N new members start, then the N old ones
              stop gracefully one by one, --phase apart, and --phase after
              the last
  kill        one member is killed with SIGKILL, then --phase
  scale-down  members stop gracefully until N/2 remain, then --phase

Requests arrive at random (Poisson) at --load × T/S per second in all,
split evenly over the live members as a load balancer would. Each is a
transaction, BEGIN; SELECT pg_sleep(S); COMMIT (S: --service), with a
deadline D (--deadline): it succeeds if it commits within D.

Arms (the baseline first):
  one        one process, a gate with B = T (start and steady only)
  static4    each member a gate with B = T/4: sized for the ordinary day
  static8    each member a gate with B = T/8: sized for the deploy's peak
  fleet      each member a gate in one fleet budget (fleet.Join): T and
             the queue shared through PostgreSQL advisory locks, one round
             per --fleet-interval; the coordination session has an
             application_name of its own
  pgbouncer  members ungated (database/sql, a pool of 1000) through a
             PgBouncer in transaction mode with default_pool_size T, which
             this command starts on a free port (--pgbouncer)

Each gate waits at most wait = D − 2·S and queues Q = max(B, ⌊B/S·wait⌋)
unless --queue-wait and --max-queue are given (--max-queue is then the
fleet's total, split in proportion to B for the static gates).

It polls pg_stat_activity every --poll for the service's transactions open
on the server (its application_name, begun before the poll's statement)
and reports, per arm and phase: the most at one instant, the goodput
(successes per second), the p99 latency of successes, the p99 time for a
failure to come back (a gate's rejection; behind PgBouncer, mostly the
deadline) and, for the fleet, how long after each start, stop and kill the
live members' shares took to settle (to ⌊T/n⌋, plus one for T mod n of
them). A killed member's last report is lost. The members, the server and
this command share the machine's CPUs: say so with the figures. Use a
server nobody else depends on. Ctrl-C stops the members and reports what
was measured.
`

const fleetExamples = `  experiments fleet --dsn postgres://postgres@127.0.0.1:5432/test --chart docs/fleet.svg
  experiments fleet --dsn postgres://postgres@127.0.0.1:5432/test --arms one,fleet --phase 2s --fleet-interval 500ms --json -
  experiments fleet --dsn postgres://postgres@127.0.0.1:5432/test --members 2 --max-concurrent 4 --service 20ms
`

// The arms of the experiment, in the order they run.
const (
	armOne       = "one"
	armStatic4   = "static4"
	armStatic8   = "static8"
	armFleet     = "fleet"
	armPgBouncer = "pgbouncer"
)

var fleetArms = []string{armOne, armStatic4, armStatic8, armFleet, armPgBouncer}

// The phases of an arm, in order; the baseline runs the first two.
const (
	phaseStart     = "start"
	phaseSteady    = "steady"
	phaseDeploy    = "deploy"
	phaseKill      = "kill"
	phaseScaleDown = "scale-down"
)

// Limits and constants of the experiment.
const (
	maxFleetMembers  = 16
	maxFleetTotal    = 1000
	fleetReportEvery = 100 * time.Millisecond // a member's reports
	fleetBucket      = 100 * time.Millisecond // the server's series, for the JSON and the chart
	fleetTeardown    = memberStopLimit + 10*time.Second
)

// fleetConfig is a validated fleet command line.
type fleetConfig struct {
	target       *cli.Target
	arms         []string
	members      int
	total        int           // T
	queue        int           // the fleet's total Q; < 0: by the rule
	wait         time.Duration // < 0: by the rule
	service      time.Duration // S
	deadline     time.Duration // D
	load         float64       // offered, in multiples of T/S
	phase        time.Duration
	warmup       time.Duration
	interval     time.Duration // fleet.Interval
	fallback     *int          // fleet.Fallback; nil: the library's default
	poll         time.Duration
	seed         uint64
	pgbouncer    string // the binary; "" to look it up
	out          cli.Outputs
	policySource string
}

func (e *env) fleet(ctx context.Context, args []string) int {
	cfg, code, done := e.parseFleet(args)
	if done {
		return code
	}
	rep, err := e.runFleet(ctx, cfg)
	if ctx.Err() != nil && (rep == nil || !rep.measured()) {
		fmt.Fprintln(e.Stderr, "bulkhead: fleet: interrupted before anything was measured")
		return cli.ExitInterrupted
	}
	if rep == nil || (err != nil && ctx.Err() == nil) {
		if rep != nil && len(rep.Arms) > 0 {
			rep.printTable(e.Stderr)
		}
		return e.Fail(fmt.Errorf("fleet: %w", err))
	}
	chart := func(path string) error { return writeFleetChart(path, rep) }
	return e.Report(ctx, "fleet", cfg.out, rep.measured(), rep.printTable, chart, rep)
}

func (e *env) parseFleet(args []string) (*fleetConfig, int, bool) {
	fs := e.NewFlagSet("fleet", fleetUsage, fleetExamples)
	dsn := fs.String("dsn", "", "PostgreSQL URL postgres://...")
	arms := fs.String("arms", strings.Join(fleetArms, ","), "arms to run, comma-separated: one, static4, static8, fleet, pgbouncer")
	members := fs.Int("members", 4, "members N of the steady phase (the deploy runs 2N at its peak)")
	// S is long enough that T/S, what the budget lets through, is a small
	// part of what the machine runs: the arms then differ by their
	// budgets. At S = 10 ms, --load 1.5 is 1200 requests per second
	// through 4 to 8 processes; on this project's two cores the members'
	// CPU and the server's forks (dials, cancel requests) then decided
	// the outcome more than the budgets did.
	service := fs.Duration("service", 50*time.Millisecond, "S: each transaction's pg_sleep")
	deadline := fs.Duration("deadline", 500*time.Millisecond, "D: a request succeeds if it commits within D")
	load := fs.Float64("load", 1.5, "requests per second in all, as a multiple of the capacity T/S")
	phase := fs.Duration("phase", 3*time.Second, "length of each phase (and of each step of the deploy)")
	warmup := fs.Duration("warmup", 2*time.Second, "length of the start phase, before steady")
	interval := fs.Duration("fleet-interval", fleet.DefaultInterval, "the fleet arm's coordination interval (fleet.Interval), at least 10ms")
	poll := fs.Duration("poll", 5*time.Millisecond, "how often pg_stat_activity is read")
	var fallback cli.OptInt
	fs.Var(&fallback, "fleet-fallback", fmt.Sprintf("the fleet arm's share while its coordination fails (fleet.Fallback; default %d, the library's)", fleet.DefaultFallback))
	pi := e.AddPolicyFlags(fs)
	seed := fs.Uint64("seed", 1, "seed of the arrival times")
	pgb := fs.String("pgbouncer", "", "the PgBouncer binary of the pgbouncer arm (default: pgbouncer in PATH or /usr/sbin)")
	out := cli.AddOutputFlags(fs, "the results")
	set, code, done := e.Parse(fs, args)
	if done {
		return nil, code, true
	}
	bad := cli.Failer[fleetConfig](e.Env, "fleet")
	cfg := &fleetConfig{
		members: *members, service: *service, deadline: *deadline, load: *load, phase: *phase, warmup: *warmup,
		interval: *interval, poll: *poll, seed: *seed, pgbouncer: *pgb, out: *out,
	}
	var err error
	if cfg.arms, err = parseArms(*arms); err != nil {
		return bad("--arms %q: %v", *arms, err)
	}
	has := func(a string) bool { return slices.Contains(cfg.arms, a) }
	switch {
	case cfg.members < 1 || cfg.members > maxFleetMembers:
		return bad("--members is %d, want 1 to %d", cfg.members, maxFleetMembers)
	case cfg.deadline <= 0 || cfg.deadline > time.Hour:
		return bad("--deadline is %v, want more than 0s and at most 1h0m0s", cfg.deadline)
	case cfg.service <= 0 || cfg.service >= cfg.deadline:
		return bad("--service is %v, want more than 0s and less than the deadline (%v)", cfg.service, cfg.deadline)
	case !(cfg.load > 0 && cfg.load <= 100):
		return bad("--load is %v, want more than 0 and at most 100 (multiples of T/S)", cfg.load)
	case cfg.phase <= 0 || cfg.phase > time.Hour:
		return bad("--phase is %v, want more than 0s and at most 1h0m0s", cfg.phase)
	case cfg.warmup < 0 || cfg.warmup > time.Hour:
		return bad("--warmup is %v, want 0s to 1h0m0s", cfg.warmup)
	case cfg.interval < 10*time.Millisecond || cfg.interval > time.Hour:
		return bad("--fleet-interval is %v, want 10ms to 1h0m0s", cfg.interval)
	case cfg.poll < time.Millisecond || cfg.poll > time.Second:
		return bad("--poll is %v, want 1ms to 1s", cfg.poll)
	case set["fleet-interval"] && !has(armFleet):
		return bad("--fleet-interval does nothing without the fleet arm (--arms %s); want fleet in --arms, or no --fleet-interval", *arms)
	case set["fleet-fallback"] && !has(armFleet):
		return bad("--fleet-fallback does nothing without the fleet arm (--arms %s); want fleet in --arms, or no --fleet-fallback", *arms)
	case set["fleet-fallback"] && (fallback.V < 0 || fallback.V > maxFleetTotal):
		return bad("--fleet-fallback is %d, want 0 to %d", fallback.V, maxFleetTotal)
	case set["pgbouncer"] && !has(armPgBouncer):
		return bad("--pgbouncer does nothing without the pgbouncer arm (--arms %s); want pgbouncer in --arms, or no --pgbouncer", *arms)
	case has(armFleet) && cfg.phase < 2*cfg.interval:
		return bad("--phase %v is shorter than two fleet intervals (--fleet-interval %v): the shares could not settle within a phase; want --phase of at least %v", cfg.phase, cfg.interval, 2*cfg.interval)
	}
	r, err := pi.Resolve(set, bulkhead.Policy{MaxConcurrent: 8})
	if err != nil {
		return bad("%w", err)
	}
	if set["fleet-fallback"] {
		cfg.fallback = &fallback.V
	}
	cfg.total, cfg.queue, cfg.wait = r.P.MaxConcurrent, -1, -1
	if r.Given(cli.SetQ) {
		cfg.queue = r.P.MaxQueue
	}
	if r.Given(cli.SetWait) {
		cfg.wait = r.P.QueueWait
	}
	cfg.policySource = fmt.Sprintf("T %s, Q %s, wait %s", r.Describe(cli.SetB), r.Describe(cli.SetQ), r.Describe(cli.SetWait))
	switch {
	case cfg.total > maxFleetTotal:
		return bad("T is %d (%s), want 1 to %d", cfg.total, r.Describe(cli.SetB), maxFleetTotal)
	case cfg.queue > cli.MaxClients:
		return bad("Q is %d (%s), want 0 to %d", cfg.queue, r.Describe(cli.SetQ), cli.MaxClients)
	case cfg.rate() > maxOverloadRate:
		return bad("--load %v × T/S is %.0f requests per second, want at most %d", cfg.load, cfg.rate(), maxOverloadRate)
	}
	for _, arm := range cfg.arms {
		if arm == armPgBouncer {
			continue
		}
		p := cfg.armPolicy(arm)
		if err := p.Validate(); err != nil {
			return bad("the %s arm's policy B=%d Q=%d wait=%v (%s) is invalid: %w", arm, p.MaxConcurrent, p.MaxQueue, p.QueueWait, cfg.policySource, err)
		}
	}
	if err := cfg.out.Check(); err != nil {
		return bad("%w", err)
	}
	if !set["dsn"] {
		if v, ok := e.Lookup("DATABASE_URL"); !ok || v == "" {
			return bad("no database: want --dsn postgres://... or DATABASE_URL (the experiment runs on PostgreSQL)")
		}
	}
	t, err := e.ResolveTarget(*dsn, set["dsn"])
	if err != nil {
		return bad("%w", err)
	}
	if t.Dialect != cli.DialectPostgres {
		return bad("%s is %s; the experiment runs on PostgreSQL (advisory locks, pg_stat_activity, pg_sleep): want postgres://...", t.Display, t.Dialect.Title())
	}
	cfg.target = t
	return cfg, cli.ExitOK, false
}

// parseArms parses "fleet,one": arms, each once, run in the experiment's
// order whatever the order given.
func parseArms(s string) ([]string, error) { return parseSubset(s, fleetArms, "an arm") }

// rate is the requests per second offered in all: --load × T/S.
func (cfg *fleetConfig) rate() float64 {
	return cfg.load * float64(cfg.total) / cfg.service.Seconds()
}

// queueWait is the gates' wait: given, or D − 2·S by the rule.
func (cfg *fleetConfig) queueWait() time.Duration {
	if cfg.wait >= 0 {
		return cfg.wait
	}
	return max(cfg.deadline-2*cfg.service, 0).Round(time.Millisecond)
}

// armB is B of one member of an arm (for the fleet, T).
func (cfg *fleetConfig) armB(arm string) int {
	switch arm {
	case armStatic4:
		return max(1, cfg.total/4)
	case armStatic8:
		return max(1, cfg.total/8)
	}
	return cfg.total
}

// armPolicy is the policy of one member of a gated arm: B, and Q by the
// rule (a transaction takes S, so B/S drain per second) or, when given,
// the total's share in proportion to B.
func (cfg *fleetConfig) armPolicy(arm string) bulkhead.Policy {
	b, wait := cfg.armB(arm), cfg.queueWait()
	var q int
	switch {
	case cfg.queue >= 0:
		q = cfg.queue * b / cfg.total
	case wait > 0:
		q = max(b, int(math.Floor(float64(b)/cfg.service.Seconds()*wait.Seconds())))
	}
	return bulkhead.Policy{MaxConcurrent: b, MaxQueue: q, QueueWait: wait}
}

// armSetup describes an arm for the table and the chart.
func (cfg *fleetConfig) armSetup(arm string) string {
	switch arm {
	case armPgBouncer:
		return fmt.Sprintf("ungated members (database/sql, MaxOpenConns %d) through PgBouncer, pool_mode transaction, default_pool_size %d", memberMaxOpen, cfg.total)
	case armFleet:
		p := cfg.armPolicy(arm)
		fb := fleet.DefaultFallback
		if cfg.fallback != nil {
			fb = *cfg.fallback
		}
		return fmt.Sprintf("fleet budget T=%d Q=%d wait=%v shared, interval %v, fallback %d", p.MaxConcurrent, p.MaxQueue, p.QueueWait, cfg.interval, fb)
	case armOne:
		return "one process, " + cli.PolicySetup(cfg.armPolicy(arm), "")
	}
	return "each member " + cli.PolicySetup(cfg.armPolicy(arm), "")
}

// The results, as written by --json. Times are seconds from the start of
// the arm.
type (
	fleetReport struct {
		Database      string      `json:"database"`
		ServerVersion string      `json:"server_version,omitempty"`
		CPUs          int         `json:"cpus"`
		GoVersion     string      `json:"go_version"`
		Total         int         `json:"total"` // T
		Members       int         `json:"members"`
		ServiceMs     float64     `json:"service_ms"`
		DeadlineMs    float64     `json:"deadline_ms"`
		Load          float64     `json:"load"`       // multiple of T/S
		RatePerS      float64     `json:"rate_per_s"` // offered in all
		QueueWaitMs   float64     `json:"queue_wait_ms"`
		Rule          bool        `json:"policy_by_rule"`
		PhaseS        float64     `json:"phase_s"`
		WarmupS       float64     `json:"warmup_s"`
		IntervalS     float64     `json:"fleet_interval_s"`
		PollMs        float64     `json:"poll_ms"`
		Interrupted   bool        `json:"interrupted"`
		ElapsedS      float64     `json:"elapsed_s"`
		Arms          []*fleetArm `json:"arms"`
	}
	fleetArm struct {
		Name        string            `json:"name"`
		Setup       string            `json:"setup"`
		Policy      *cli.PolicyJSON   `json:"policy,omitempty"` // a member's (the fleet's: the totals)
		Interrupted bool              `json:"interrupted"`
		Phases      []*fleetPhase     `json:"phases"`
		Events      []*fleetEvent     `json:"events"`
		Members     []fleetMemberInfo `json:"members"`
		ServerTx    []fleetPoint      `json:"server_tx"`           // the most in each 100 ms
		ShareSum    []fleetPoint      `json:"share_sum,omitempty"` // the fleet: the members' shares added up, at each change
		Shares      []fleetShare      `json:"shares,omitempty"`    // the fleet: each member's share changes, as it reported them
		Polls       int               `json:"polls"`
		PollError   string            `json:"poll_error,omitempty"`
		Errors      []string          `json:"errors,omitempty"`
	}
	fleetPhase struct {
		Name             string         `json:"name"`
		BeginS           float64        `json:"begin_s"`
		EndS             float64        `json:"end_s"`
		MembersFirst     int            `json:"members_first"` // live members as the phase began
		MembersMax       int            `json:"members_max"`
		MembersLast      int            `json:"members_last"`
		Arrived          int64          `json:"arrived"` // requests that ended, by outcome below
		Succeeded        int64          `json:"succeeded"`
		Late             int64          `json:"late"`
		RejectedFull     int64          `json:"rejected_full"`
		RejectedTimeout  int64          `json:"rejected_timeout"`
		DeadlineExceeded int64          `json:"deadline_exceeded"`
		Other            int64          `json:"other_errors"`
		ErrorSamples     map[string]int `json:"error_samples,omitempty"`
		OfferedPerS      float64        `json:"offered_per_s"`
		GoodputPerS      float64        `json:"goodput_per_s"`
		SuccessMs        *cli.Pct       `json:"success_ms,omitempty"`
		FailureMs        *cli.Pct       `json:"failure_ms,omitempty"`
		ServerMaxTx      *int           `json:"server_max_transactions,omitempty"`
		ServerMaxConns   *int           `json:"server_max_connections,omitempty"` // the service's sessions, coordination sessions aside
		Dials            int64          `json:"dials"`                            // server connections the members' gates dialed
		Polls            int            `json:"polls"`
		SettleMaxS       *float64       `json:"settle_max_s,omitempty"` // the fleet: the slowest of the phase's events to settle
		Unsettled        int            `json:"unsettled,omitempty"`    // events whose shares had not settled by the next event
		RoundFailures    int            `json:"fleet_round_failures"`   // the fleet: coordination rounds that failed (the share then falls to the fallback)
	}
	fleetEvent struct {
		T       float64  `json:"t"`
		Kind    string   `json:"kind"` // start, stop (graceful), kill (SIGKILL)
		Members []int    `json:"members"`
		Live    int      `json:"live"` // members live after it
		Phase   string   `json:"phase"`
		SettleS *float64 `json:"settle_s,omitempty"`    // the fleet: until the shares equalled the split
		WithinS float64  `json:"unsettled_s,omitempty"` // not settled within this, the time to the next event
		ReadyS  *float64 `json:"ready_s,omitempty"`     // a start: until the last process started had its gate (and its first round under way)
	}
	fleetMemberInfo struct {
		Index   int      `json:"index"`
		Pid     int      `json:"pid"`
		StartS  float64  `json:"start_s"`
		ReadyS  *float64 `json:"ready_s,omitempty"`
		StopS   *float64 `json:"stop_s,omitempty"`
		KillS   *float64 `json:"kill_s,omitempty"`
		Exit    string   `json:"exit"`
		Reports int      `json:"reports"`
	}
	fleetPoint struct {
		T float64 `json:"t"`
		V float64 `json:"v"`
	}
	fleetShare struct {
		T      float64 `json:"t"`
		Member int     `json:"member"`
		B      int     `json:"b"`
		Failed bool    `json:"failed,omitempty"` // a failed round set it (the fallback)
	}
)

// measured reports whether any arm has a phase.
func (rep *fleetReport) measured() bool {
	for _, a := range rep.Arms {
		if len(a.Phases) > 0 {
			return true
		}
	}
	return false
}

// arm returns the arm named, or nil.
func (rep *fleetReport) arm(name string) *fleetArm {
	for _, a := range rep.Arms {
		if a.Name == name {
			return a
		}
	}
	return nil
}

// phase returns the arm's phase named, or nil.
func (a *fleetArm) phase(name string) *fleetPhase {
	if a == nil {
		return nil
	}
	for _, p := range a.Phases {
		if p.Name == name {
			return p
		}
	}
	return nil
}

func (e *env) runFleet(ctx context.Context, cfg *fleetConfig) (*fleetReport, error) {
	self := os.Executable
	if e.Self != nil {
		self = e.Self
	}
	bin, err := self()
	if err != nil {
		return nil, fmt.Errorf("cannot find this program to start the members: %w", err)
	}
	var pgbBin string
	if slices.Contains(cfg.arms, armPgBouncer) {
		if pgbBin, err = findPgBouncer(cfg.pgbouncer); err != nil {
			return nil, err
		}
	}
	rep := &fleetReport{
		Database: cfg.target.Display, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
		Total: cfg.total, Members: cfg.members, ServiceMs: cli.Ms(cfg.service), DeadlineMs: cli.Ms(cfg.deadline),
		Load: cfg.load, RatePerS: cfg.rate(), QueueWaitMs: cli.Ms(cfg.queueWait()), Rule: cfg.queue < 0 && cfg.wait < 0,
		PhaseS: cfg.phase.Seconds(), WarmupS: cfg.warmup.Seconds(), IntervalS: cfg.interval.Seconds(), PollMs: cli.Ms(cfg.poll),
	}
	rep.ServerVersion = serverVersion(ctx, cfg.target)
	if rep.ServerVersion == "" && ctx.Err() == nil {
		// serverVersion says nothing of why: ask once more for the error.
		db := sql.OpenDB(cfg.target.PlainConnector("bulkhead-monitor"))
		pctx, cancel := context.WithTimeout(ctx, 2*cli.ConnectTimeout)
		err := db.PingContext(pctx)
		cancel()
		db.Close()
		if err != nil {
			return nil, fmt.Errorf("cannot connect to %s: %w", cfg.target.Display, err)
		}
	}
	start := time.Now()
	log := &lockedWriter{w: e.Stderr}
	run := &fleetRun{cfg: cfg, log: log, bin: bin, pgbBin: pgbBin, id: fmt.Sprintf("bhfleet-%d", os.Getpid())}
	for _, name := range cfg.arms {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(log, "fleet: arm %s: %s\n", name, cfg.armSetup(name))
		arm, err := run.arm(ctx, name)
		if arm != nil && (len(arm.Phases) > 0 || err == nil) {
			rep.Arms = append(rep.Arms, arm)
		}
		if err != nil {
			rep.ElapsedS = time.Since(start).Seconds()
			rep.Interrupted = ctx.Err() != nil
			if ctx.Err() != nil {
				return rep, nil
			}
			return rep, fmt.Errorf("arm %s: %w", name, err)
		}
		if g := arm.phase(phaseSteady); g != nil {
			fmt.Fprintf(log, "fleet: arm %s: steady goodput %.0f/s, most server transactions %s\n", name, g.GoodputPerS, intOr(g.ServerMaxTx))
		}
	}
	rep.ElapsedS = time.Since(start).Seconds()
	rep.Interrupted = ctx.Err() != nil
	return rep, nil
}

func intOr(v *int) string {
	if v == nil {
		return "-"
	}
	return strconv.Itoa(*v)
}

// fleetRun is one run of the experiment: what every arm shares.
type fleetRun struct {
	cfg    *fleetConfig
	log    io.Writer // progress and the members' stderr, from any goroutine
	bin    string    // this program, to start the members
	pgbBin string
	id     string // bhfleet-<pid>
}

// armRun is one arm being run: its members, what they said, the server's
// counts.
type armRun struct {
	r        *fleetRun
	name     string
	app      string // the service's sessions
	coordApp string // a fleet's coordination sessions
	fleet    string
	via      string // PgBouncer's address
	t0       time.Time

	mu      sync.Mutex
	members []*memberProc
	data    armData
	phase   int
	failed  chan struct{} // closed when a member ended on its own
	failErr error
	pgbErr  string
}

// memberProc is one member process.
type memberProc struct {
	idx  int
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // output read to the end and process waited for

	inMu  sync.Mutex
	stdin io.WriteCloser
	state memberState // guarded by the arm's mu

	started          time.Time
	ready, stopped   time.Time
	killed           time.Time
	exit             string
	reports          int
	lastErr, stderrs string
}

type memberState int

const (
	memberRunning memberState = iota
	memberStopping
	memberKilled
)

// armData is what an arm measured, as summarize reads it: every time in
// Unix nanoseconds.
type armData struct {
	t0      int64
	phases  []phaseSpan
	reports []memberReport
	shares  []shareChange
	events  []eventRec
	samples []fleetSample
	members []fleetMemberInfo
}

type phaseSpan struct {
	name       string
	begin, end int64
}

type memberReport struct {
	member int
	msg    memberMsg
}

// shareChange is a fleet member's B from time t on; failed: a failed
// coordination round set it.
type shareChange struct {
	member int
	t      int64
	b      int
	failed bool
	phase  int
}

type eventRec struct {
	t       int64
	kind    string
	members []int
	live    []int // the members live after it
	phase   int
}

type fleetSample struct {
	t         int64
	tx, conns int
}

// arm runs one arm from start to end: its members are all gone when it
// returns.
func (r *fleetRun) arm(ctx context.Context, name string) (*fleetArm, error) {
	cfg := r.cfg
	a := &armRun{r: r, name: name, app: r.id + "-" + name, coordApp: r.id + "-" + name + "-coord", failed: make(chan struct{})}
	if name == armFleet {
		a.fleet = fmt.Sprintf("%s-%d", r.id, time.Now().UnixNano()%1e9)
	}
	mon, err := startFleetPoller(ctx, cfg.target, a.app, cfg.poll)
	if err != nil {
		return nil, err
	}
	defer mon.Close()
	var pgb *pgBouncer
	if name == armPgBouncer {
		if pgb, err = startPgBouncer(ctx, r.pgbBin, cfg.target, cfg.total, r.log); err != nil {
			return nil, err
		}
		defer pgb.stop()
		a.via = pgb.addr
	}
	a.t0 = time.Now()
	a.data.t0 = a.t0.UnixNano()
	runErr := a.schedule(ctx)
	end := time.Now()
	a.teardown()
	if pgb != nil {
		if last, ok := pgb.exited(); ok {
			a.mu.Lock()
			a.pgbErr = "PgBouncer exited during the arm: " + last
			a.mu.Unlock()
		}
		pgb.stop()
	}
	mon.Drain(drainLimit, 20*time.Millisecond)
	mon.Stop()

	a.mu.Lock()
	defer a.mu.Unlock()
	if n := len(a.data.phases); n > 0 && a.data.phases[n-1].end == 0 {
		a.data.phases[n-1].end = end.UnixNano()
	}
	a.data.samples = mon.samples()
	for _, m := range a.members {
		a.data.members = append(a.data.members, m.info(a.data.t0))
	}
	arm := summarize(&a.data, cfg.deadline, cfg.total, name == armFleet)
	arm.Name, arm.Setup = name, cfg.armSetup(name)
	if name != armPgBouncer {
		p := cfg.armPolicy(name)
		arm.Policy = &cli.PolicyJSON{MaxConcurrent: p.MaxConcurrent, MaxQueue: p.MaxQueue, QueueWaitMs: cli.Ms(p.QueueWait)}
	}
	arm.Interrupted = ctx.Err() != nil
	if n, err := mon.failures(); err != nil {
		arm.PollError = fmt.Sprintf("%d polls failed, the first: %s", n, cli.OneLine(err))
	}
	if a.pgbErr != "" {
		arm.Errors = append(arm.Errors, a.pgbErr)
	}
	for _, m := range a.members {
		if m.lastErr != "" {
			arm.Errors = append(arm.Errors, fmt.Sprintf("member %d: %s", m.idx, m.lastErr))
		}
	}
	if runErr == nil && a.failErr != nil {
		runErr = a.failErr
	}
	return arm, runErr
}

// schedule runs the arm's phases; it returns at their end, on ctx's end
// (nil: the caller sees ctx), or when a member failed.
func (a *armRun) schedule(ctx context.Context) error {
	cfg := a.r.cfg
	n := cfg.members
	if a.name == armOne {
		n = 1
	}
	type step struct {
		act  func() error
		hold time.Duration
	}
	type phase struct {
		name  string
		steps []step
	}
	startN := func(k int) func() error { return func() error { return a.startMembers(ctx, k) } }
	stopOldest := func(k int) func() error { return func() error { return a.stopMembers(k) } }
	phases := []phase{
		{phaseStart, []step{{startN(n), cfg.warmup}}},
		{phaseSteady, []step{{nil, cfg.phase}}},
	}
	if a.name != armOne {
		deploy := []step{{startN(n), cfg.phase}}
		for range n {
			deploy = append(deploy, step{stopOldest(1), cfg.phase})
		}
		phases = append(phases,
			phase{phaseDeploy, deploy},
			phase{phaseKill, []step{{a.killOne, cfg.phase}}},
			phase{phaseScaleDown, []step{{func() error { return a.stopMembers(a.live() - max(1, n/2)) }, cfg.phase}}},
		)
	}
	for i, ph := range phases {
		a.beginPhase(i, ph.name)
		for _, st := range ph.steps {
			if st.act != nil {
				if err := st.act(); err != nil {
					return err
				}
			}
			if !a.hold(ctx, st.hold) {
				return a.failure() // nil when interrupted
			}
		}
	}
	return nil
}

// failure is the error of a member that ended on its own, or nil.
func (a *armRun) failure() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.failErr
}

// hold waits d; false if ctx ended or a member failed first.
func (a *armRun) hold(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-a.failed:
	}
	return false
}

// beginPhase ends the phase before and tells the live members that what
// follows belongs to phase i.
func (a *armRun) beginPhase(i int, name string) {
	now := time.Now().UnixNano()
	a.mu.Lock()
	if n := len(a.data.phases); n > 0 {
		a.data.phases[n-1].end = now
	}
	a.data.phases = append(a.data.phases, phaseSpan{name: name, begin: now})
	a.phase = i
	live := a.liveLocked()
	a.mu.Unlock()
	for _, m := range live {
		m.send(memberCommand{Phase: &i})
	}
}

func (a *armRun) liveLocked() []*memberProc {
	var live []*memberProc
	for _, m := range a.members {
		if m.state == memberRunning {
			live = append(live, m)
		}
	}
	return live
}

func (a *armRun) live() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.liveLocked())
}

// event records an event and gives each live member its share of the
// offered rate.
func (a *armRun) event(kind string, who []*memberProc, at time.Time) {
	a.mu.Lock()
	live := a.liveLocked()
	ev := eventRec{t: at.UnixNano(), kind: kind, phase: a.phase}
	for _, m := range who {
		ev.members = append(ev.members, m.idx)
	}
	for _, m := range live {
		ev.live = append(ev.live, m.idx)
	}
	a.data.events = append(a.data.events, ev)
	a.mu.Unlock()
	if len(live) == 0 {
		return
	}
	rate := a.r.cfg.rate() / float64(len(live))
	for _, m := range live {
		m.send(memberCommand{Rate: &rate})
	}
}

// startMembers starts k members at once.
func (a *armRun) startMembers(ctx context.Context, k int) error {
	cfg := a.r.cfg
	live := a.live()
	rate := cfg.rate() / float64(live+k)
	at := time.Now()
	var started []*memberProc
	for range k {
		m, err := a.startMember(ctx, rate)
		if err != nil {
			return err
		}
		started = append(started, m)
	}
	a.event("start", started, at)
	return nil
}

func (a *armRun) startMember(ctx context.Context, rate float64) (*memberProc, error) {
	cfg := a.r.cfg
	a.mu.Lock()
	idx := len(a.members)
	ph := a.phase
	a.mu.Unlock()
	mc := memberConfig{
		Index: idx, Arm: a.name, DSN: cfg.target.PG.ConnString(), Via: a.via, App: a.app, CoordApp: a.coordApp,
		Fleet: a.fleet, Gated: a.name != armPgBouncer, Interval: cfg.interval, Fallback: cfg.fallback, Service: cfg.service,
		Deadline: cfg.deadline, Rate: rate, Phase: ph, Report: fleetReportEvery, Seed: cfg.seed,
	}
	if mc.Gated {
		p := cfg.armPolicy(a.name)
		mc.B, mc.Q, mc.Wait = p.MaxConcurrent, p.MaxQueue, p.QueueWait
	}
	line, err := json.Marshal(mc)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(a.r.bin, fleetMemberCmd)
	ownProcessGroup(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	m := &memberProc{idx: idx, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	cmd.Stderr = &memberStderr{m: m, arm: a}
	m.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start member %d (%s %s): %w", idx, a.r.bin, fleetMemberCmd, err)
	}
	m.pid = cmd.Process.Pid
	a.mu.Lock()
	a.members = append(a.members, m)
	a.mu.Unlock()
	go a.read(m, stdout)
	// A member that cannot read it ends at once, and read reports why.
	m.send(json.RawMessage(line))
	return m, nil
}

// memberStderr passes a member's stderr on, each line prefixed, and
// keeps its last line for the error a failed member is reported with.
type memberStderr struct {
	m   *memberProc
	arm *armRun
	buf []byte
}

func (w *memberStderr) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		fmt.Fprintf(w.arm.r.log, "fleet: %s member %d: %s\n", w.arm.name, w.m.idx, line)
		w.arm.mu.Lock()
		w.m.stderrs = line
		w.arm.mu.Unlock()
	}
	return len(p), nil
}

// read takes a member's messages until its output ends, then waits for
// the process; a member that ends while it should run fails the arm.
func (a *armRun) read(m *memberProc, stdout io.Reader) {
	defer close(m.done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for sc.Scan() {
		var msg memberMsg
		if err := json.Unmarshal(sc.Bytes(), &msg); err != nil {
			a.mu.Lock()
			m.lastErr = fmt.Sprintf("unreadable output %q", truncate(sc.Text(), 200))
			a.mu.Unlock()
			continue
		}
		a.take(m, msg)
	}
	err := m.cmd.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case m.state == memberKilled:
		m.exit = "killed (SIGKILL)"
	case err != nil:
		m.exit = err.Error()
	default:
		m.exit = "exited"
	}
	if m.state == memberRunning {
		why := m.lastErr
		if why == "" {
			why = m.stderrs
		}
		if why == "" {
			why = m.exit
		}
		if a.failErr == nil {
			a.failErr = fmt.Errorf("member %d (pid %d) ended while it should run: %s", m.idx, m.pid, why)
			close(a.failed)
		}
		m.state = memberStopping
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// take records one message of member m.
func (a *armRun) take(m *memberProc, msg memberMsg) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch msg.Type {
	case msgReady:
		m.ready = time.Unix(0, msg.T)
	case msgReport:
		m.reports++
		a.data.reports = append(a.data.reports, memberReport{member: m.idx, msg: msg})
	case msgShare:
		a.data.shares = append(a.data.shares, shareChange{member: m.idx, t: msg.T, b: msg.B, failed: msg.Err != "", phase: msg.Phase})
		if msg.Err != "" {
			m.lastErr = "fleet round failed: " + msg.Err
		}
	case msgError:
		m.lastErr = msg.Err
	case msgBye:
		if msg.Err != "" {
			m.lastErr = "closing: " + msg.Err
		}
	}
}

// send writes a command to a live member; a member gone meanwhile is not
// an error here (its end is seen by read).
func (m *memberProc) send(c any) {
	b, err := json.Marshal(c)
	if err != nil {
		return
	}
	m.inMu.Lock()
	defer m.inMu.Unlock()
	if m.stdin != nil {
		m.stdin.Write(append(b, '\n'))
	}
}

// closeInput ends a member's input: it stops gracefully.
func (m *memberProc) closeInput() {
	m.inMu.Lock()
	defer m.inMu.Unlock()
	if m.stdin != nil {
		m.stdin.Close()
		m.stdin = nil
	}
}

// stopMembers stops the k oldest live members gracefully, at once.
func (a *armRun) stopMembers(k int) error {
	if k <= 0 {
		return nil
	}
	at := time.Now()
	a.mu.Lock()
	live := a.liveLocked()
	stop := live[:min(k, len(live))]
	for _, m := range stop {
		m.state, m.stopped = memberStopping, at
	}
	a.mu.Unlock()
	for _, m := range stop {
		m.closeInput()
	}
	a.event("stop", stop, at)
	return nil
}

// killOne kills the oldest live member with SIGKILL: no goodbye.
func (a *armRun) killOne() error {
	at := time.Now()
	a.mu.Lock()
	live := a.liveLocked()
	if len(live) == 0 {
		a.mu.Unlock()
		return nil
	}
	m := live[0]
	m.state, m.killed = memberKilled, at
	a.mu.Unlock()
	if err := m.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("cannot kill member %d (pid %d): %w", m.idx, m.pid, err)
	}
	m.closeInput()
	a.event("kill", []*memberProc{m}, at)
	return nil
}

// teardown stops every member still running, waits for them all (a
// bounded time), and kills those that did not end.
func (a *armRun) teardown() {
	a.mu.Lock()
	live := a.liveLocked()
	now := time.Now()
	for _, m := range live {
		m.state, m.stopped = memberStopping, now
	}
	all := slices.Clone(a.members)
	a.mu.Unlock()
	for _, m := range live {
		m.closeInput()
	}
	limit := time.NewTimer(fleetTeardown)
	defer limit.Stop()
wait:
	for _, m := range all {
		select {
		case <-m.done:
		case <-limit.C:
			break wait
		}
	}
	for _, m := range all {
		select {
		case <-m.done:
		default:
			a.mu.Lock()
			m.lastErr = fmt.Sprintf("did not end within %v of its stop: killed", fleetTeardown)
			a.mu.Unlock()
			m.cmd.Process.Kill()
			<-m.done
		}
	}
}

// info describes a member for the JSON.
func (m *memberProc) info(t0 int64) fleetMemberInfo {
	rel := func(t time.Time) *float64 {
		if t.IsZero() {
			return nil
		}
		v := float64(t.UnixNano()-t0) / 1e9
		return &v
	}
	return fleetMemberInfo{Index: m.idx, Pid: m.pid, StartS: *rel(m.started), ReadyS: rel(m.ready),
		StopS: rel(m.stopped), KillS: rel(m.killed), Exit: m.exit, Reports: m.reports}
}

// fleetPoller reads pg_stat_activity every few milliseconds on its own
// connection: the service's transactions open on the server.
type fleetPoller struct {
	*cli.Poller

	mu     sync.Mutex
	list   []fleetSample
	err    error // the first failed poll
	failed int   // polls that failed
}

func startFleetPoller(ctx context.Context, t *cli.Target, app string, every time.Duration) (*fleetPoller, error) {
	a, err := cli.OpenActivityDB(ctx, t, app)
	if err != nil {
		return nil, err
	}
	p := &fleetPoller{}
	p.Poller = a.Poll(every, func(at time.Time, tx, conns int, err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil {
			// A server too busy to answer within a second is part of
			// what is measured: the next poll tries again.
			p.err = cmpOr(p.err, err)
			p.failed++
			return
		}
		p.list = append(p.list, fleetSample{t: at.UnixNano(), tx: tx, conns: conns})
	})
	return p, nil
}

func (p *fleetPoller) samples() []fleetSample {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.list)
}

// failures returns how many polls failed, and the first one's error.
func (p *fleetPoller) failures() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed, p.err
}

// fleetSplit is the shares of n members of a fleet of total, largest
// first: ⌊total/n⌋, plus one for the first total mod n.
func fleetSplit(total, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = total / n
		if i < total%n {
			out[i]++
		}
	}
	return out
}

// settleTime returns how long after ev the shares of the members live
// after it equalled the split of total among them, looking no later than
// until; ok is false if they did not. shares are every member's changes,
// in time order; a member without one has a share of 0.
func settleTime(ev eventRec, until int64, shares []shareChange, total int) (d time.Duration, ok bool) {
	want := fleetSplit(total, len(ev.live))
	cur := map[int]int{}
	check := func() bool {
		got := make([]int, 0, len(ev.live))
		for _, m := range ev.live {
			got = append(got, cur[m])
		}
		slices.SortFunc(got, func(a, b int) int { return b - a })
		return slices.Equal(got, want)
	}
	i := 0
	for ; i < len(shares) && shares[i].t <= ev.t; i++ {
		cur[shares[i].member] = shares[i].b
	}
	if check() {
		return 0, true
	}
	for ; i < len(shares) && shares[i].t < until; i++ {
		c := shares[i]
		cur[c.member] = c.b
		if (i+1 == len(shares) || shares[i+1].t != c.t) && check() {
			return time.Duration(c.t - ev.t), true
		}
	}
	return 0, false
}

// summarize turns what an arm measured into its results.
func summarize(d *armData, deadline time.Duration, total int, fleet bool) *fleetArm {
	rel := func(t int64) float64 { return float64(t-d.t0) / 1e9 }
	arm := &fleetArm{Members: d.members, Polls: len(d.samples), Events: []*fleetEvent{}, Phases: []*fleetPhase{}}
	slices.SortStableFunc(d.shares, func(a, b shareChange) int { return cmpInt64(a.t, b.t) })
	slices.SortStableFunc(d.samples, func(a, b fleetSample) int { return cmpInt64(a.t, b.t) })
	type acc struct {
		ok, fail []time.Duration
	}
	accs := make([]acc, len(d.phases))
	for _, sp := range d.phases {
		arm.Phases = append(arm.Phases, &fleetPhase{Name: sp.name, BeginS: rel(sp.begin), EndS: rel(sp.end)})
	}
	for _, r := range d.reports {
		k := r.msg.Phase
		if k < 0 || k >= len(arm.Phases) {
			continue
		}
		ph, m := arm.Phases[k], r.msg
		ph.Succeeded += m.OK
		ph.Late += m.Late
		ph.RejectedFull += m.Full
		ph.RejectedTimeout += m.Timeout
		ph.DeadlineExceeded += m.Deadline
		ph.Other += m.Other
		for _, us := range m.OKUs {
			accs[k].ok = append(accs[k].ok, time.Duration(us)*time.Microsecond)
		}
		for _, us := range m.FailUs {
			accs[k].fail = append(accs[k].fail, time.Duration(us)*time.Microsecond)
		}
		for msg, n := range m.Errors {
			if ph.ErrorSamples == nil {
				ph.ErrorSamples = map[string]int{}
			}
			if _, ok := ph.ErrorSamples[msg]; ok || len(ph.ErrorSamples) < cli.MaxErrSamples {
				ph.ErrorSamples[msg] += n
			}
		}
	}
	// Dials: each member's count grows; a phase gets what it grew by in
	// the member's reports of the phase.
	last := map[int]int64{}
	for _, r := range d.reports {
		if k := r.msg.Phase; k >= 0 && k < len(arm.Phases) && r.msg.Dials > last[r.member] {
			arm.Phases[k].Dials += r.msg.Dials - last[r.member]
			last[r.member] = r.msg.Dials
		}
	}
	for _, c := range d.shares {
		if c.failed && c.phase >= 0 && c.phase < len(arm.Phases) {
			arm.Phases[c.phase].RoundFailures++
		}
	}
	for k, sp := range d.phases {
		ph := arm.Phases[k]
		ph.Arrived = ph.Succeeded + ph.Late + ph.RejectedFull + ph.RejectedTimeout + ph.DeadlineExceeded + ph.Other
		if secs := float64(sp.end-sp.begin) / 1e9; secs > 0 {
			ph.OfferedPerS = float64(ph.Arrived) / secs
			ph.GoodputPerS = float64(ph.Succeeded) / secs
		}
		ph.SuccessMs, ph.FailureMs = cli.Percentiles(accs[k].ok), cli.Percentiles(accs[k].fail)
		most, conns := -1, -1
		for _, s := range d.samples {
			if s.t >= sp.begin && s.t < sp.end {
				ph.Polls++
				most, conns = max(most, s.tx), max(conns, s.conns)
			}
		}
		if most >= 0 {
			ph.ServerMaxTx, ph.ServerMaxConns = &most, &conns
		}
	}
	// Members live as each phase began, at most, and as it ended.
	live := 0
	for k, ph := range arm.Phases {
		ph.MembersFirst, ph.MembersMax = live, live
		for _, ev := range d.events {
			if ev.phase == k {
				live = len(ev.live)
				ph.MembersMax = max(ph.MembersMax, live)
			}
		}
		ph.MembersLast = live
	}
	for i, ev := range d.events {
		until := int64(math.MaxInt64)
		if i+1 < len(d.events) {
			until = d.events[i+1].t
		} else if n := len(d.phases); n > 0 {
			until = d.phases[n-1].end
		}
		fe := &fleetEvent{T: rel(ev.t), Kind: ev.kind, Members: ev.members, Live: len(ev.live)}
		if ev.kind == "start" {
			ready := 0.0
			for _, m := range d.members {
				if slices.Contains(ev.members, m.Index) && m.ReadyS != nil {
					ready = max(ready, *m.ReadyS-fe.T)
				}
			}
			fe.ReadyS = &ready
		}
		if ev.phase >= 0 && ev.phase < len(arm.Phases) {
			fe.Phase = arm.Phases[ev.phase].Name
		}
		if fleet {
			ph := arm.Phases[ev.phase]
			if dt, ok := settleTime(ev, until, d.shares, total); ok {
				s := dt.Seconds()
				fe.SettleS = &s
				if ph.SettleMaxS == nil || s > *ph.SettleMaxS {
					ph.SettleMaxS = &s
				}
			} else {
				fe.WithinS = float64(until-ev.t) / 1e9
				ph.Unsettled++
			}
		}
		arm.Events = append(arm.Events, fe)
	}
	// The server's series: the most in each bucket, while the phases ran.
	var samples []fleetSample
	if n := len(d.phases); n > 0 {
		for _, s := range d.samples {
			if s.t >= d.phases[0].begin && s.t < d.phases[n-1].end {
				samples = append(samples, s)
			}
		}
	}
	if len(samples) > 0 {
		b := int64(fleetBucket)
		cur, most := (samples[0].t-d.t0)/b, -1
		flush := func() {
			if most >= 0 {
				arm.ServerTx = append(arm.ServerTx, fleetPoint{T: (float64(cur) + 0.5) * fleetBucket.Seconds(), V: float64(most)})
			}
		}
		for _, s := range samples {
			if k := (s.t - d.t0) / b; k != cur {
				flush()
				cur, most = k, -1
			}
			most = max(most, s.tx)
		}
		flush()
	}
	if fleet {
		arm.ShareSum = shareSum(d, rel)
		for _, c := range d.shares {
			arm.Shares = append(arm.Shares, fleetShare{T: rel(c.t), Member: c.member, B: c.b, Failed: c.failed})
		}
	}
	return arm
}

// shareSum is the members' shares added up after each change; a killed
// member's share ends with it (the server frees its slots).
func shareSum(d *armData, rel func(int64) float64) []fleetPoint {
	changes := slices.Clone(d.shares)
	for _, ev := range d.events {
		if ev.kind == "kill" {
			for _, m := range ev.members {
				changes = append(changes, shareChange{member: m, t: ev.t, b: 0})
			}
		}
	}
	slices.SortStableFunc(changes, func(a, b shareChange) int { return cmpInt64(a.t, b.t) })
	cur := map[int]int{}
	killed := map[int]bool{}
	out := []fleetPoint{{T: 0, V: 0}}
	for i, c := range changes {
		if killed[c.member] {
			continue
		}
		cur[c.member] = c.b
		for _, ev := range d.events {
			if ev.kind == "kill" && ev.t == c.t && slices.Contains(ev.members, c.member) {
				killed[c.member] = true
			}
		}
		if i+1 < len(changes) && changes[i+1].t == c.t {
			continue
		}
		sum := 0
		for _, b := range cur {
			sum += b
		}
		out = append(out, fleetPoint{T: rel(c.t), V: float64(sum)})
	}
	return out
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// splitHostPort parses host:port for pgx.
func splitHostPort(addr string) (string, uint16, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", port, err)
	}
	return host, uint16(p), nil
}

// errNoPgBouncer says how to get PgBouncer.
var errNoPgBouncer = errors.New("the pgbouncer arm needs PgBouncer: install it (Debian: apt-get install pgbouncer), give its binary with --pgbouncer, or leave pgbouncer out of --arms")
