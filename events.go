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

func (k Kind) String() string {
	switch k {
	case KindTx:
		return "transaction"
	case KindExec:
		return "statement"
	case KindQuery:
		return "query"
	}
	return "unknown"
}

// Event describes one step of a gated operation.
type Event struct {
	Kind     Kind
	Workload string        // the workload budget it passed, "" for none
	Reason   error         // OnReject: ErrAdmissionFull, ErrQueueTimeout or ErrWouldMissDeadline
	DryRun   bool          // OnReject: the rejection was not made (Policy.DryRun)
	Waited   time.Duration // time spent waiting for the execution permits
	Held     time.Duration // OnRelease and hold warnings: time the permits were held
}

// Events are callbacks on the gate's decisions, each called synchronously
// on the goroutine of the operation (OnRelease: on the goroutine that ended
// it, possibly database/sql's own): they must be fast, must not block and
// must not call the gate. Nil callbacks are skipped. A panic in one is
// logged and recovered.
type Events struct {
	OnAdmit   func(Event) // the permits and a server connection acquired
	OnReject  func(Event) // rejected (or, with DryRun set, would have been); not called for cancellations
	OnRelease func(Event) // the permits about to be given back (an admission they make possible comes after)
}

// emit calls an event callback, recovering a panic in it: it would
// otherwise escape between taking permits and registering their release.
func emit(f func(Event), e Event) {
	defer func() {
		if v := recover(); v != nil {
			slog.Default().Error("bulkhead: event callback panicked", "kind", e.Kind.String(), "panic", v, "stack", string(debug.Stack()))
		}
	}()
	f(e)
}

// JoinEvents returns Events that call, for each callback, those of es in
// order; a callback no element sets stays nil.
func JoinEvents(es ...Events) Events {
	var admit, reject, release []func(Event)
	for _, e := range es {
		if e.OnAdmit != nil {
			admit = append(admit, e.OnAdmit)
		}
		if e.OnReject != nil {
			reject = append(reject, e.OnReject)
		}
		if e.OnRelease != nil {
			release = append(release, e.OnRelease)
		}
	}
	return Events{OnAdmit: fanOut(admit), OnReject: fanOut(reject), OnRelease: fanOut(release)}
}

func fanOut(fs []func(Event)) func(Event) {
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	return func(e Event) {
		for _, f := range fs {
			f(e)
		}
	}
}

// ReasonLabel names the cause of a rejection for logs and metric labels:
// "admission_full", "queue_timeout" or "would_miss_deadline" (errors.Is, so that a rejection or
// an Event.Reason both work); "" for anything else.
func ReasonLabel(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrAdmissionFull):
		return "admission_full"
	case errors.Is(err, ErrQueueTimeout):
		return "queue_timeout"
	case errors.Is(err, ErrWouldMissDeadline):
		return "would_miss_deadline"
	}
	return ""
}
