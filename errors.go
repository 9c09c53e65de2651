package bulkhead

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"time"
)

// Sentinel errors. A rejection matches ErrRejected and exactly one of
// ErrAdmissionFull, ErrQueueTimeout, ErrWouldMissDeadline and
// ErrLeaseExpired. None of them
// matches driver.ErrBadConn, so database/sql never retries a rejection.
var (
	// ErrRejected is matched by every rejection: the database is at its
	// budget, try later. A rejected operation sent nothing to the server.
	ErrRejected = errors.New("bulkhead: rejected")
	// ErrAdmissionFull: all B+Q admission permits were taken.
	ErrAdmissionFull = errors.New("bulkhead: admission full")
	// ErrQueueTimeout: no execution permit came within the queue wait.
	ErrQueueTimeout = errors.New("bulkhead: queue wait timed out")
	// ErrWouldMissDeadline: the expected wait plus the measured hold time
	// would pass the context's deadline.
	ErrWouldMissDeadline = errors.New("bulkhead: would miss its deadline")
	// ErrLeaseExpired: a lease (Gate.CapUntil, a fleet member's share) ran
	// out, and either the fallback share it left had no room for the
	// operation, or the operation was let in under the lease and it ran out
	// before the operation reached the driver.
	ErrLeaseExpired = errors.New("bulkhead: lease expired")
	// ErrClosed: the gate was closed. It is not a rejection.
	ErrClosed = errors.New("bulkhead: closed")
	// ErrOutcomeUnknown: a COMMIT got no answer within the driver's bound
	// (pgxgate.EndGrace) and may have taken effect. Not a rejection, nor a
	// context error unless the context ended too: check before retrying.
	ErrOutcomeUnknown = errors.New("bulkhead: outcome unknown")
)

// ErrTxStillOpen refuses a BeginTx or statement on a *sql.Conn whose
// transaction's context ended before its rollback ran. It is not a
// rejection: try again, or take a fresh *sql.Conn.
var ErrTxStillOpen = errors.New("bulkhead: the connection's transaction has not ended yet (its context ended; database/sql is rolling it back)")

// RejectedError is the error of a rejection; errors.Is matches it with
// ErrRejected and its Cause. Treat it as read-only: callers may share it.
type RejectedError struct {
	Cause            error         // ErrAdmissionFull, ErrQueueTimeout, ErrWouldMissDeadline or ErrLeaseExpired
	Workload         string        // the workload whose budget refused it; "" for the global budget
	MaxConcurrent    int           // B of that budget
	MaxQueue         int           // Q of that budget
	Running, Waiting int           // that budget's operations running, and admitted and waiting
	Waited           time.Duration // time spent waiting; 0 for ErrAdmissionFull
	// ErrWouldMissDeadline: what it was judged on. Hold is the hold its kind
	// of work takes (the median of its last ones), Ahead the wait expected
	// before its turn, Left the time left until its deadline: Ahead+Hold >
	// Left; or, for a waiter whose turn had not come, Left = 2×Hold.
	Hold, Ahead, Left time.Duration
}

func (e *RejectedError) Error() string {
	budget := ""
	if e.Workload != "" {
		budget = fmt.Sprintf(" for workload %q", e.Workload)
	}
	held := fmt.Sprintf("%d running + %d waiting of B=%d, Q=%d", e.Running, e.Waiting, e.MaxConcurrent, e.MaxQueue)
	switch e.Cause {
	case ErrQueueTimeout:
		return fmt.Sprintf("bulkhead: queue wait timed out%s after %v: %s", budget, e.Waited, held)
	case ErrWouldMissDeadline:
		if e.Ahead+e.Hold <= e.Left {
			return fmt.Sprintf("bulkhead: would miss its deadline%s: still waiting after %v with %v left, twice what its kind of work holds its permits: %s",
				budget, e.Waited, e.Left, held)
		}
		return fmt.Sprintf("bulkhead: would miss its deadline%s after a wait of %v: %v left, its kind of work holds its permits %v after about %v more of waiting: %s",
			budget, e.Waited, e.Left, e.Hold, e.Ahead, held)
	case ErrLeaseExpired:
		return fmt.Sprintf("bulkhead: lease expired%s (Gate.CapUntil), on its fallback share: %s", budget, held)
	}
	return fmt.Sprintf("bulkhead: admission full%s: %s", budget, held)
}

// Is reports whether target is ErrRejected or the error's Cause.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected || target == e.Cause }

// canceledError is a driver's error returned after the caller's context
// ended: errors.Is and errors.As match both the context's and the driver's.
type canceledError struct{ ctx, err error }

func (e *canceledError) Error() string   { return e.ctx.Error() + ": " + e.err.Error() }
func (e *canceledError) Unwrap() []error { return []error{e.ctx, e.err} }

// ctxErr returns err, made to match ctx's error too if ctx ended, except
// for the errors database/sql itself acts on.
func ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	cerr := ctx.Err()
	if cerr == nil || err == driver.ErrSkip || err == io.EOF || err == driver.ErrRemoveArgument ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, cerr) {
		return err
	}
	return &canceledError{ctx: cerr, err: err}
}

// opErr is ctxErr for a statement or BEGIN: after ctx ended, pgx's "nothing
// sent" driver.ErrBadConn matches ctx's error instead, so database/sql keeps
// a sound connection (the driver checks it at its next use) and retries nothing.
func opErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && errors.Is(err, driver.ErrBadConn) {
		return &canceledError{ctx: ctx.Err(), err: errors.New(err.Error())}
	}
	return ctxErr(ctx, err)
}
