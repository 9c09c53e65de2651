package bulkhead

import (
	"log/slog"
	"runtime/debug"
	"time"
)

// Kind says what a gated operation is.
type Kind uint8

const (
	KindTx    Kind = iota + 1 // a transaction, from BeginTx until the driver's Commit or Rollback returned
	KindExec                  // an autocommit statement (Exec, or a prepared statement's Exec)
	KindQuery                 // an autocommit query, until its Rows are closed
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
	Workload string        // the operation's workload, "" for none
	Reason   error         // OnReject: ErrAdmissionFull, ErrQueueTimeout or ErrNoConnection
	DryRun   bool          // OnReject: the rejection was not made (Policy.DryRun)
	Waited   time.Duration // time spent waiting for the execution permits
	Held     time.Duration // OnRelease and hold warnings: time the permits were held
}

// Events are callbacks on the gate's decisions. Each is called
// synchronously, on the goroutine of the operation (OnRelease: on the
// goroutine that ended it, possibly database/sql's own), so it must be
// fast and must not block or call the gate. Nil callbacks are skipped.
type Events struct {
	OnAdmit   func(Event) // the permits and a server connection acquired; Waited set
	OnReject  func(Event) // rejected (or, with DryRun set, would have been); Reason and Waited set. Cancellations are not rejections.
	OnRelease func(Event) // the permits about to be given back (an admission they make possible comes after); Waited and Held set
	// OnFleet: in a fleet (Policy.Fleet), this process's share changed, or
	// a coordination round failed (Err set). Called on the coordination
	// goroutine.
	OnFleet func(FleetEvent)
}

// emit calls an event callback. A panic in it is logged and recovered: it
// would otherwise escape through database/sql between taking permits and
// registering their release, or before database/sql returns the connection
// to its pool, losing permits or a connection for good.
func emit(f func(Event), e Event) {
	defer func() {
		if v := recover(); v != nil {
			slog.Default().Error("bulkhead: event callback panicked", "kind", e.Kind.String(), "panic", v, "stack", string(debug.Stack()))
		}
	}()
	f(e)
}
