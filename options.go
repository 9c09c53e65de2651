package bulkhead

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"time"
)

// Option configures a Gate beyond its Policy.
type Option func(*options)

type options struct {
	events    Events
	holdLimit time.Duration
	onHold    func(Event)
	reserve   time.Duration
	pgDL      *PostgresDeadline
}

// Kind says what a gated operation is.
type Kind uint8

const (
	KindTx      Kind = iota + 1 // a transaction, from BeginTx until the driver's Commit or Rollback returned
	KindExec                    // an autocommit statement (Exec, or a prepared statement's Exec)
	KindQuery                   // an autocommit query, until its Rows are closed
	KindConnect                 // a dial refused by the connector (rejections only)
)

func (k Kind) String() string {
	switch k {
	case KindTx:
		return "transaction"
	case KindExec:
		return "statement"
	case KindQuery:
		return "query"
	case KindConnect:
		return "connect"
	}
	return "unknown"
}

// Event describes one step of a gated operation.
type Event struct {
	Kind     Kind
	Workload string        // the operation's workload, "" for none
	Reason   error         // OnReject: ErrAdmissionFull or ErrQueueTimeout
	DryRun   bool          // OnReject: the rejection was not made (Policy.DryRun)
	Waited   time.Duration // time spent waiting for the execution permits
	Held     time.Duration // OnRelease and hold warnings: time the permits were held
}

// Events are callbacks on the gate's decisions. Each is called
// synchronously, on the goroutine of the operation (OnRelease: on the
// goroutine that ended it, possibly database/sql's own), so it must be
// fast and must not block or call the gate. Nil callbacks are skipped.
type Events struct {
	OnAdmit   func(Event) // both permits acquired; Waited set
	OnReject  func(Event) // rejected (or, with DryRun set, would have been); Reason and Waited set. Cancellations are not rejections.
	OnRelease func(Event) // both permits given back; Waited and Held set
}

// WithEvents sets callbacks on admit, reject and release. Default: none.
// With OnRelease set, each operation also reads the clock when it starts.
func WithEvents(e Events) Option { return func(o *options) { o.events = e } }

// WithHoldWarning reports every operation that holds its permits longer
// than limit (a transaction left open, Rows never closed), like HikariCP's
// leak detection threshold: report is called once, limit after the permits
// were granted, with Kind, Waited and Held (= limit), on a timer goroutine
// (time.AfterFunc), while the operation still runs. A nil report logs a
// warning through slog.Default. A limit ≤ 0 turns the warning off (the
// default).
func WithHoldWarning(limit time.Duration, report func(Event)) Option {
	return func(o *options) {
		o.holdLimit = limit
		o.onHold = report
		if report == nil {
			o.onHold = logHold
		}
	}
}

// WithDeadlineReserve makes the wait for an execution permit end no later
// than the caller's deadline minus reserve: work that could not finish in
// time is rejected with ErrQueueTimeout (RejectedError.Deadline set)
// instead of being started. reserve is the time the work needs once
// started; 0 (the default) lets the wait run to the deadline itself, which
// then ends it with context.DeadlineExceeded.
func WithDeadlineReserve(reserve time.Duration) Option {
	return func(o *options) { o.reserve = max(reserve, 0) }
}

// PostgresDeadline configures WithPostgresDeadline.
type PostgresDeadline struct {
	// Reserve is subtracted from the time left before the caller's deadline
	// (the time the caller needs after the database answered).
	Reserve time.Duration
	// LockTimeout also sets lock_timeout to the same value.
	LockTimeout bool
}

// WithPostgresDeadline makes each gated transaction whose context has a
// deadline start with
//
//	SET LOCAL statement_timeout = <ms left before the deadline, minus Reserve>
//
// (and lock_timeout with LockTimeout), so that PostgreSQL itself stops work
// nobody will wait for (SQLSTATE 57014), even when the client's cancel
// request is late or lost. It costs one round trip per transaction with a
// deadline, sent on the transaction before BeginTx returns. PostgreSQL
// only; autocommit statements are not affected. The timeout is at least
// 1ms: a transaction started with less time left fails at its first
// statement.
func WithPostgresDeadline(d PostgresDeadline) Option {
	return func(o *options) { o.pgDL = &d }
}

func logHold(e Event) {
	slog.Default().Warn("bulkhead: operation holds its permits longer than the hold warning",
		"kind", e.Kind.String(), "workload", e.Workload, "held", e.Held, "waited", e.Waited)
}

// permit is the state of one gated operation while it holds its permits.
type permit struct {
	kind   Kind
	wl     *limiter // the workload's budget, nil for none
	waited time.Duration
	start  time.Time   // set only when something needs the hold time
	timer  *time.Timer // the hold warning, if set
}

// acquire takes the permits of ctx's workload (if any) and the global
// ones for an operation of kind k, recording in p what release needs.
func (g *Gate) acquire(ctx context.Context, k Kind, p *permit) error {
	o := fromContext(ctx)
	var budgets [2]*limiter
	ls := budgets[:0]
	wl := g.workload(o.workload)
	name := "" // the workload whose budget the operation passes: never a name the policy does not list
	if wl != nil {
		ls = append(ls, wl)
		name = wl.workload
	}
	ls = append(ls, g.lim)
	var q queueing
	err := q.acquire(ctx, ls, o.wait, g.opt.reserve)
	waited := q.waited()
	if err != nil {
		if g.opt.events.OnReject != nil && errors.Is(err, ErrRejected) {
			emit(g.opt.events.OnReject, Event{Kind: k, Workload: name, Reason: rejectReason(err), Waited: waited})
		}
		return err
	}
	if q.wouldReject && g.opt.events.OnReject != nil {
		emit(g.opt.events.OnReject, Event{Kind: k, Workload: name, Reason: ErrAdmissionFull, DryRun: true})
	}
	p.kind, p.wl, p.waited = k, wl, waited
	if g.opt.events.OnRelease != nil {
		p.start = time.Now()
	}
	if g.opt.holdLimit > 0 {
		limit, report := g.opt.holdLimit, g.opt.onHold
		p.timer = time.AfterFunc(limit, func() { emit(report, Event{Kind: k, Workload: name, Waited: waited, Held: limit}) })
	}
	if g.opt.events.OnAdmit != nil {
		emit(g.opt.events.OnAdmit, Event{Kind: k, Workload: name, Waited: waited})
	}
	return nil
}

// release gives back the permits of p, acquired by acquire.
func (g *Gate) release(p *permit) {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	// The reverse of acquire's order: while the workload's permit is
	// still held, no other operation of the workload can take the global
	// permit given back, so the workload never holds more than its B of
	// global permits.
	g.lim.release()
	if p.wl != nil {
		p.wl.release()
	}
	if g.opt.events.OnRelease != nil {
		e := Event{Kind: p.kind, Waited: p.waited, Held: time.Since(p.start)}
		if p.wl != nil {
			e.Workload = p.wl.workload
		}
		emit(g.opt.events.OnRelease, e)
	}
}

// rejectReason is the sentinel behind a rejection.
func rejectReason(err error) error {
	if errors.Is(err, ErrQueueTimeout) {
		return ErrQueueTimeout
	}
	return ErrAdmissionFull
}

// emit calls an event callback. A panic in it is logged and recovered: it
// would otherwise escape through database/sql between taking permits and
// registering their release, or before database/sql returns the connection
// to its pool, losing permits or a connection slot for good.
func emit(f func(Event), e Event) {
	defer func() {
		if v := recover(); v != nil {
			slog.Default().Error("bulkhead: event callback panicked", "kind", e.Kind.String(), "panic", v, "stack", string(debug.Stack()))
		}
	}()
	f(e)
}
