package bulkhead

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Option configures a Gate beyond its Policy.
type Option func(*options)

type options struct {
	events    Events
	holdLimit time.Duration
	onHold    func(Event)
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
	Kind   Kind
	Reason error         // OnReject: ErrAdmissionFull or ErrQueueTimeout
	Waited time.Duration // time spent waiting for the execution permit
	Held   time.Duration // OnRelease and hold warnings: time the permits were held
}

// Events are callbacks on the gate's decisions. Each is called
// synchronously, on the goroutine of the operation (OnRelease: on the
// goroutine that ended it, possibly database/sql's own), so it must be
// fast and must not block or call the gate. Nil callbacks are skipped.
type Events struct {
	OnAdmit   func(Event) // both permits acquired; Waited set
	OnReject  func(Event) // rejected; Reason and Waited set. Cancellations are not rejections.
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

func logHold(e Event) {
	slog.Default().Warn("bulkhead: operation holds its permits longer than the hold warning",
		"kind", e.Kind.String(), "held", e.Held, "waited", e.Waited)
}

// permit is the state of one gated operation while it holds its permits.
type permit struct {
	kind   Kind
	waited time.Duration
	start  time.Time   // set only when something needs the hold time
	timer  *time.Timer // the hold warning, if set
}

// acquire takes both permits for an operation of kind k, recording what
// the events need in p.
func (g *Gate) acquire(ctx context.Context, k Kind, p *permit) error {
	waited, err := g.lim.acquire(ctx)
	if err != nil {
		if g.opt.events.OnReject != nil && errors.Is(err, ErrRejected) {
			g.opt.events.OnReject(Event{Kind: k, Reason: rejectReason(err), Waited: waited})
		}
		return err
	}
	p.kind, p.waited = k, waited
	if g.opt.events.OnRelease != nil {
		p.start = time.Now()
	}
	if g.opt.holdLimit > 0 {
		limit, report := g.opt.holdLimit, g.opt.onHold
		p.timer = time.AfterFunc(limit, func() { report(Event{Kind: k, Waited: waited, Held: limit}) })
	}
	if g.opt.events.OnAdmit != nil {
		g.opt.events.OnAdmit(Event{Kind: k, Waited: waited})
	}
	return nil
}

// release gives back the permits of p, acquired by acquire.
func (g *Gate) release(p *permit) {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	g.lim.release()
	if g.opt.events.OnRelease != nil {
		g.opt.events.OnRelease(Event{Kind: p.kind, Waited: p.waited, Held: time.Since(p.start)})
	}
}

// rejectReason is the sentinel behind a rejection.
func rejectReason(err error) error {
	if errors.Is(err, ErrQueueTimeout) {
		return ErrQueueTimeout
	}
	return ErrAdmissionFull
}
