package bulkhead

import (
	"errors"
	"log/slog"
	"runtime/debug"
	"time"
)

// Kind says what a gated operation is.
type Kind uint8

const (
	KindTx    Kind = iota + 1 // a transaction, from BeginTx until the driver's Commit or Rollback returned
	KindExec                  // an autocommit statement (Exec, or a prepared statement's Exec)
	KindQuery                 // an autocommit query, until its rows are closed
)

var kindNames = [...]string{KindTx: "transaction", KindExec: "statement", KindQuery: "query"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "unknown"
}

// Event describes one step of a gated operation.
type Event struct {
	Kind     Kind
	Workload string        // the workload budget it passed, "" for none
	Reason   error         // OnReject: ErrAdmissionFull, ErrQueueTimeout, ErrWouldMissDeadline or ErrLeaseExpired
	DryRun   bool          // OnReject: the rejection was not made (Policy.DryRun)
	Waited   time.Duration // time spent waiting for the execution permits
	Held     time.Duration // OnRelease and hold warnings: time the permits were held
}

// Events are callbacks on the gate's decisions, called synchronously on the
// operation's goroutine (OnRelease: the one ending it). They must be fast,
// not block and not call the gate; nil ones are skipped, panics recovered.
type Events struct {
	OnAdmit   func(Event) // the permits and a server connection acquired
	OnReject  func(Event) // rejected (or, with DryRun set, would have been); not called for cancellations
	OnRelease func(Event) // the permits about to be given back (an admission they make possible comes after)
	OnLimit   func(Move)  // Policy.Adaptive moved the B in force, on the goroutine of the release that ended its window
}

// emit calls f, logging and recovering a panic: it would escape between
// taking permits and registering their release.
func emit(f func(Event), e Event) {
	defer func() {
		if v := recover(); v != nil {
			slog.Default().Error("bulkhead: event callback panicked", "kind", e.Kind.String(), "panic", v, "stack", string(debug.Stack()))
		}
	}()
	f(e)
}

// emitMove is emit for OnLimit.
func emitMove(f func(Move), m Move) {
	defer func() {
		if v := recover(); v != nil {
			slog.Default().Error("bulkhead: event callback panicked", "kind", "limit", "panic", v, "stack", string(debug.Stack()))
		}
	}()
	f(m)
}

// JoinEvents returns Events calling each callback of es in order; one no
// element sets stays nil.
func JoinEvents(es ...Events) Events {
	var j Events
	for _, e := range es {
		j.OnAdmit = then(j.OnAdmit, e.OnAdmit)
		j.OnReject = then(j.OnReject, e.OnReject)
		j.OnRelease = then(j.OnRelease, e.OnRelease)
		switch f, g := j.OnLimit, e.OnLimit; {
		case f == nil:
			j.OnLimit = g
		case g != nil:
			j.OnLimit = func(m Move) { f(m); g(m) }
		}
	}
	return j
}

// then returns a callback calling f, then g; nil if both are.
func then(f, g func(Event)) func(Event) {
	switch {
	case f == nil:
		return g
	case g == nil:
		return f
	}
	return func(e Event) {
		f(e)
		g(e)
	}
}

// ReasonLabel names the cause of a rejection or Event.Reason for metric
// labels: "admission_full", "queue_timeout", "would_miss_deadline",
// "lease_expired" or "".
func ReasonLabel(err error) string {
	switch {
	case errors.Is(err, ErrAdmissionFull):
		return "admission_full"
	case errors.Is(err, ErrQueueTimeout):
		return "queue_timeout"
	case errors.Is(err, ErrWouldMissDeadline):
		return "would_miss_deadline"
	case errors.Is(err, ErrLeaseExpired):
		return "lease_expired"
	}
	return ""
}

// Move is a change of the B in force under Policy.Adaptive and the signal
// it was made on (Stats.LastMove).
type Move struct {
	From, To int
	// Why: "slow start" (doubling while it pays), "queueing" (more than one
	// and a half operations wait inside the database), "room" (under a
	// third does), "explore" (a periodic step up), "climb" (a step up right
	// after one that was kept), "undone" (the step before won, or lost, too
	// much or too little), "kept" (the step before was judged and kept), or
	// "" before any.
	Why string
	// Queued is Vegas's estimate of the operations waiting inside the
	// database over the window the move was made on, B·(1 − mean(base/held))
	// with each hold's class's base hold; Gain is that window's goodput ÷
	// the one before the step judged (0: none judged).
	Queued, Gain float64
}
