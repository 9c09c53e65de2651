package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/fleet"
)

// A member of the fleet experiment is this same program started again by
// "experiments fleet" with the hidden command fleet-member: one instance of
// the service, under open-loop arrivals, through one arm's configuration.
//
// The protocol, one JSON object a line each way:
//
//	stdin   the first line is the member's memberConfig; then commands
//	        ({"rate": r}: arrivals per second from now on; {"phase": k}:
//	        the requests arriving from now on belong to phase k, and the
//	        reports so far are sent at once). End of input (or SIGTERM) stops the member
//	        gracefully: no new arrivals, the requests in flight end, a last
//	        report, the *sql.DB is closed (a fleet member's gate leaves the fleet),
//	        then "bye".
//	stdout  memberMsg lines: "ready" once the database is open, "report"s
//	        every cfg.Report and at each phase mark (one per phase whose
//	        requests ended since the last: a request counts in the phase
//	        it arrived in), a "share" each time a
//	        fleet member's share changes (fleet.OnChange), "bye" at the
//	        end, or "error" and exit 2 if the member cannot run.
//
// Times are Unix nanoseconds: the members and the orchestrator share one
// machine's clock. A member killed with SIGKILL says nothing more: what it
// had not reported yet is lost.

// fleetMemberCmd is the hidden command: not in the help, not in the list
// of commands an unknown one is told.
const fleetMemberCmd = "fleet-member"

// memberConfig is what a member runs: the first line of its input.
type memberConfig struct {
	Index    int           `json:"index"`
	Arm      string        `json:"arm"`
	DSN      string        `json:"dsn"`                // the PostgreSQL server
	Via      string        `json:"via,omitempty"`      // host:port of a PgBouncer in front of it (the pgbouncer arm)
	App      string        `json:"app"`                // application_name of the service's sessions
	CoordApp string        `json:"coord_app"`          // application_name of a fleet's coordination session
	Fleet    string        `json:"fleet,omitempty"`    // the fleet it joins (fleet.Join); "" for a static gate or none
	Gated    bool          `json:"gated"`              // through a gate (false: plain database/sql)
	B        int           `json:"b"`                  // the gate's MaxConcurrent (a fleet's T)
	Q        int           `json:"q"`                  // its MaxQueue (a fleet's total)
	Wait     time.Duration `json:"wait"`               // its QueueWait
	Interval time.Duration `json:"interval,omitempty"` // fleet.Interval
	Fallback *int          `json:"fallback,omitempty"` // fleet.Fallback; nil: the library's default
	Service  time.Duration `json:"service"`            // S: each transaction's pg_sleep
	Deadline time.Duration `json:"deadline"`           // D
	Rate     float64       `json:"rate"`               // arrivals per second at start
	Phase    int           `json:"phase"`              // the phase it starts in
	Report   time.Duration `json:"report"`             // how often it reports
	Seed     uint64        `json:"seed"`
}

// memberCommand is a later line of a member's input.
type memberCommand struct {
	Rate  *float64 `json:"rate,omitempty"`
	Phase *int     `json:"phase,omitempty"`
}

// Member message types.
const (
	msgReady  = "ready"
	msgReport = "report"
	msgShare  = "share"
	msgBye    = "bye"
	msgError  = "error"
)

// memberMsg is one line of a member's output. A report counts the
// requests of one phase (the one each arrived in) that ended in
// (From, T], by outcome, with the time each took (µs) to succeed or to
// fail.
type memberMsg struct {
	Type  string `json:"type"`
	T     int64  `json:"t"`
	Pid   int    `json:"pid,omitempty"`
	Phase int    `json:"phase"`

	From     int64          `json:"from,omitempty"`
	OK       int64          `json:"ok,omitempty"`       // committed within the deadline
	Late     int64          `json:"late,omitempty"`     // committed after it
	Full     int64          `json:"full,omitempty"`     // ErrAdmissionFull
	Timeout  int64          `json:"timeout,omitempty"`  // ErrQueueTimeout
	Deadline int64          `json:"deadline,omitempty"` // the deadline ended it
	Other    int64          `json:"other,omitempty"`
	OKUs     []int64        `json:"ok_us,omitempty"`
	FailUs   []int64        `json:"fail_us,omitempty"`
	Errors   map[string]int `json:"errors,omitempty"` // samples of the other errors

	// The gate's state as the message is sent (reports and shares).
	B         int   `json:"b"`
	Q         int   `json:"q"`
	Running   int   `json:"running,omitempty"`
	Waiting   int   `json:"waiting,omitempty"`
	Instances int   `json:"instances,omitempty"`
	Degraded  bool  `json:"degraded,omitempty"`
	Rounds    int64 `json:"rounds,omitempty"`
	Failures  int64 `json:"failures,omitempty"`
	OpenConns int   `json:"open_conns,omitempty"` // the gate's server connections
	Dials     int64 `json:"dials,omitempty"`      // dials so far
	ConnFail  int64 `json:"connect_failed,omitempty"`

	Err string `json:"err,omitempty"` // a share's failed round, or the member's error
}

// The outcomes of a member's request.
type memberOutcome int

const (
	moOK memberOutcome = iota
	moLate
	moFull
	moTimeout
	moDeadline
	moOther
)

// classifyMember decides a request's outcome.
func classifyMember(err error, lat, deadline time.Duration, opCtx context.Context) memberOutcome {
	switch {
	case err == nil && lat <= deadline:
		return moOK
	case err == nil:
		return moLate
	}
	// The member's requests are not interrupted: they end on their own.
	switch cli.Classify(err, opCtx, context.Background()) {
	case cli.OutRejectedFull:
		return moFull
	case cli.OutRejectedTimeout, cli.OutRejectedDeadline: // refused after admission
		return moTimeout
	case cli.OutDeadline:
		return moDeadline
	}
	return moOther
}

// memberRec accumulates the outcomes of the current reports, by the
// phase the requests arrived in.
type memberRec struct {
	mu     sync.Mutex
	phase  int // the phase a report is sent for when nothing ended
	from   int64
	phases map[int]*phaseCounts
}

type phaseCounts struct {
	n      [moOther + 1]int64
	okUs   []int64
	failUs []int64
	errs   map[string]int
}

func (r *memberRec) add(phase int, o memberOutcome, lat time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.phases == nil {
		r.phases = map[int]*phaseCounts{}
	}
	c := r.phases[phase]
	if c == nil {
		c = &phaseCounts{}
		r.phases[phase] = c
	}
	c.n[o]++
	us := lat.Microseconds()
	if o == moOK {
		c.okUs = append(c.okUs, us)
		return
	}
	c.failUs = append(c.failUs, us)
	if o == moOther {
		if c.errs == nil {
			c.errs = map[string]int{}
		}
		cli.AddErrSample(c.errs, err)
	}
}

// cut returns the reports of what ended since the last ones, one per
// phase, in phase order (a single empty one for the current phase when
// nothing ended), and makes phase the current one.
func (r *memberRec) cut(now int64, phase int) []memberMsg {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []memberMsg
	for _, k := range slices.Sorted(maps.Keys(r.phases)) {
		c := r.phases[k]
		out = append(out, memberMsg{Type: msgReport, T: now, Phase: k, From: r.from,
			OK: c.n[moOK], Late: c.n[moLate], Full: c.n[moFull], Timeout: c.n[moTimeout],
			Deadline: c.n[moDeadline], Other: c.n[moOther], OKUs: c.okUs, FailUs: c.failUs, Errors: c.errs})
	}
	if len(out) == 0 {
		out = append(out, memberMsg{Type: msgReport, T: now, Phase: r.phase, From: r.from})
	}
	r.phases = nil
	r.from, r.phase = now, phase
	return out
}

// memberDB is what a member runs its requests on.
type memberDB interface {
	do(ctx context.Context) error                         // one request: a transaction
	stats() (s bulkhead.Stats, f fleet.Stats, gated bool) // the gate's, if any, and the fleet member's
	close() error                                         // graceful: a fleet member's gate leaves the fleet
}

// memberOpener opens a member's database; onChange receives a fleet
// member's share changes.
type memberOpener func(ctx context.Context, cfg *memberConfig, onChange func(fleet.Event)) (memberDB, error)

// fleetMember is the hidden command: a member reading its configuration
// and commands on stdin and writing its messages on stdout.
func (e *env) fleetMember(ctx context.Context, args []string) int {
	if len(args) > 0 {
		return e.Fail(fmt.Errorf("%s: started by experiments fleet, with its configuration on stdin; unexpected argument %q", fleetMemberCmd, args[0]))
	}
	if e.Stdin == nil {
		return e.Fail(fmt.Errorf("%s: started by experiments fleet, with its configuration on stdin; no stdin", fleetMemberCmd))
	}
	if err := runMember(ctx, e.Stdin, e.Stdout, openMemberDB); err != nil {
		return e.Fail(fmt.Errorf("%s: %w", fleetMemberCmd, err))
	}
	return cli.ExitOK
}

// memberOut writes a member's messages, one line each, from any
// goroutine.
type memberOut struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error
}

func (o *memberOut) send(m memberMsg) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err == nil {
		o.err = o.enc.Encode(m)
	}
}

// memberStopLimit bounds how long a stopping member waits for its
// requests in flight (each has its deadline; this is a backstop).
const memberStopLimit = 10 * time.Second

// runMember is a member's whole life: it returns once stopped (end of in,
// or ctx), after "bye"; an error it returns was also sent as "error".
func runMember(ctx context.Context, in io.Reader, w io.Writer, open memberOpener) error {
	out := &memberOut{enc: json.NewEncoder(w)}
	fail := func(err error) error {
		out.send(memberMsg{Type: msgError, T: time.Now().UnixNano(), Pid: os.Getpid(), Err: cli.OneLine(err)})
		return err
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	if !sc.Scan() {
		return fail(fmt.Errorf("no configuration on stdin (%v)", sc.Err()))
	}
	var cfg memberConfig
	if err := json.Unmarshal(sc.Bytes(), &cfg); err != nil {
		return fail(fmt.Errorf("configuration %q: %w", sc.Text(), err))
	}
	if cfg.Deadline <= 0 || cfg.Report <= 0 || cfg.Rate < 0 {
		return fail(fmt.Errorf("configuration %q: want a deadline and a report interval above 0, a rate of at least 0", sc.Text()))
	}
	// The commands that follow, until the end of input.
	cmds := make(chan memberCommand)
	inDone := make(chan struct{})
	go func() {
		defer close(inDone)
		for sc.Scan() {
			var c memberCommand
			if json.Unmarshal(sc.Bytes(), &c) != nil {
				continue // not a command: ignored
			}
			select {
			case cmds <- c:
			case <-ctx.Done():
				return
			}
		}
	}()

	var db memberDB
	rec := &memberRec{phase: cfg.Phase, from: time.Now().UnixNano()}
	// report sends the reports cut now, each with the gate's state.
	report := func(phase int) {
		ms := rec.cut(time.Now().UnixNano(), phase)
		if s, f, gated := db.stats(); gated {
			for i := range ms {
				m := &ms[i]
				m.B, m.Q, m.Running, m.Waiting = s.MaxConcurrent, s.MaxQueue, s.Running, s.Waiting
				m.Instances, m.Degraded, m.Rounds, m.Failures = f.Instances, f.Degraded, f.Rounds, f.Failures
				m.OpenConns, m.Dials, m.ConnFail = s.OpenConns, s.Dials, s.ConnectFailed
			}
		}
		for _, m := range ms {
			out.send(m)
		}
	}
	var phaseMu sync.Mutex // the phase share events are tagged with
	phase := cfg.Phase
	onChange := func(ev fleet.Event) {
		phaseMu.Lock()
		ph := phase
		phaseMu.Unlock()
		m := memberMsg{Type: msgShare, T: time.Now().UnixNano(), Phase: ph, B: ev.MaxConcurrent, Q: ev.MaxQueue, Instances: ev.Instances}
		if ev.Err != nil {
			m.Err = cli.OneLine(ev.Err)
		}
		out.send(m)
	}
	var err error
	if db, err = open(ctx, &cfg, onChange); err != nil {
		return fail(err)
	}
	out.send(memberMsg{Type: msgReady, T: time.Now().UnixNano(), Pid: os.Getpid(), Phase: cfg.Phase})

	// Open-loop arrivals: each request in its own goroutine, with its
	// own deadline, whatever became of the ones before. They run on a
	// context of their own: a stopping member lets them end. The arrival
	// times are drawn on a timeline of their own: a late wake-up starts
	// the requests due at once, and delays none after them.
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Index)+0x9e3779b97f4a7c15))
	rate := cfg.Rate
	gap := func() time.Duration {
		if rate <= 0 {
			return time.Hour
		}
		return time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
	}
	due := time.Now().Add(gap())
	var inflight sync.WaitGroup
	arrival := time.NewTimer(time.Until(due))
	defer arrival.Stop()
	tick := time.NewTicker(cfg.Report)
	defer tick.Stop()
loop:
	for {
		select {
		case <-arrival.C:
			for now := time.Now(); !due.After(now); due = due.Add(gap()) {
				ph := phase // the main loop alone sets it
				inflight.Go(func() {
					t0 := time.Now()
					opCtx, cancel := context.WithTimeout(context.Background(), cfg.Deadline)
					err := db.do(opCtx)
					lat := time.Since(t0)
					rec.add(ph, classifyMember(err, lat, cfg.Deadline, opCtx), lat, err)
					cancel()
				})
			}
			arrival.Reset(time.Until(due))
		case <-tick.C:
			report(phase)
		case c := <-cmds:
			if c.Rate != nil && *c.Rate >= 0 {
				// Memoryless arrivals: the next one is drawn anew.
				rate = *c.Rate
				due = time.Now().Add(gap())
				arrival.Reset(time.Until(due))
			}
			if c.Phase != nil {
				phaseMu.Lock()
				phase = *c.Phase
				phaseMu.Unlock()
				report(phase)
			}
		case <-inDone:
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	// Graceful stop: the requests in flight end (each within its
	// deadline), then the last report, then the database closes.
	flown := make(chan struct{})
	go func() { inflight.Wait(); close(flown) }()
	limit := time.NewTimer(memberStopLimit)
	defer limit.Stop()
	select {
	case <-flown:
	case <-limit.C:
	}
	report(phase)
	cerr := db.close()
	<-flown // bounded: db.close ends what still ran
	bye := memberMsg{Type: msgBye, T: time.Now().UnixNano(), Phase: phase}
	if cerr != nil {
		bye.Err = cli.OneLine(cerr)
	}
	out.send(bye)
	return nil
}

// pgMemberDB runs the experiment's transaction on PostgreSQL, through a
// gate (a fleet member's or a static one) or plain database/sql.
type pgMemberDB struct {
	db     *sql.DB
	gate   *bulkhead.Gate
	member *fleet.Member                               // nil outside a fleet
	op     func(ctx context.Context, db *sql.DB) error // BEGIN; SELECT pg_sleep(S); COMMIT
}

func (m *pgMemberDB) do(ctx context.Context) error { return m.op(ctx, m.db) }

func (m *pgMemberDB) stats() (bulkhead.Stats, fleet.Stats, bool) {
	var f fleet.Stats
	if m.member != nil {
		f = m.member.Stats()
	}
	if m.gate == nil {
		return bulkhead.Stats{}, f, false
	}
	return m.gate.Stats(), f, true
}

func (m *pgMemberDB) close() error { return m.db.Close() }

// memberMaxOpen bounds an ungated member's pool: "large", so that the
// requests wait in PgBouncer's queue, not in database/sql's.
const memberMaxOpen = 1000

// openMemberDB opens a member's *sql.DB as its arm says: a gate (a fleet
// member's or a static one) on pgxgate's connector, or plain
// database/sql with a large pool, through PgBouncer when cfg.Via is set.
func openMemberDB(ctx context.Context, cfg *memberConfig, onChange func(fleet.Event)) (memberDB, error) {
	t, err := cli.ParseTarget("the member's DSN", cfg.DSN)
	if err != nil {
		return nil, err
	}
	if t.Dialect != cli.DialectPostgres {
		return nil, fmt.Errorf("the fleet experiment runs on PostgreSQL, not %s", t.Dialect.Title())
	}
	op := cli.Operation(t, "hold", cfg.Service, 0)
	if !cfg.Gated {
		pc := t.PG.Copy()
		pc.RuntimeParams["application_name"] = cfg.App
		if cfg.Via != "" {
			if pc, err = viaPgBouncer(t, cfg.Via, cfg.App); err != nil {
				return nil, err
			}
		}
		db := sql.OpenDB(stdlib.GetConnector(*pc))
		db.SetMaxOpenConns(memberMaxOpen)
		db.SetMaxIdleConns(memberMaxOpen)
		return &pgMemberDB{db: db, op: op}, nil
	}
	inner, err := t.GatedConnector(cfg.App, false)
	if err != nil {
		return nil, err
	}
	p := bulkhead.Policy{MaxConcurrent: cfg.B, MaxQueue: cfg.Q, QueueWait: cfg.Wait}
	if cfg.Fleet == "" {
		g, err := bulkhead.New(inner, p)
		if err != nil {
			return nil, err
		}
		return &pgMemberDB{db: g.OpenDB(), gate: g, op: op}, nil
	}
	opts := []fleet.Option{
		fleet.Interval(cfg.Interval),
		// The coordination session's own statements are not the
		// service's work: another application_name.
		fleet.Coordinator(t.PlainConnector(cfg.CoordApp)),
		fleet.OnChange(onChange),
	}
	if cfg.Fallback != nil {
		opts = append(opts, fleet.Fallback(*cfg.Fallback))
	}
	m, err := fleet.Join(cfg.Fleet, inner, p, opts...)
	if err != nil {
		return nil, err
	}
	return &pgMemberDB{db: m.Gate().OpenDB(), gate: m.Gate(), member: m, op: op}, nil
}
