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
// ErrAdmissionFull, ErrQueueTimeout and ErrWouldMissDeadline. None of them matches
// driver.ErrBadConn, so database/sql never retries a rejection.
var (
	// ErrRejected is matched by every rejection: the database is at its
	// budget, try later (HTTP 503 with Retry-After). A rejected operation
	// sent nothing to the server.
	ErrRejected = errors.New("bulkhead: rejected")
	// ErrAdmissionFull: all B+Q admission permits were taken; the
	// operation was refused at once.
	ErrAdmissionFull = errors.New("bulkhead: admission full")
	// ErrQueueTimeout: the operation was admitted, but no execution
	// permit came within the queue wait.
	ErrQueueTimeout = errors.New("bulkhead: queue wait timed out")
	// ErrWouldMissDeadline: the operation's context has a deadline it
	// could no longer make: the wait expected ahead of it, or the wait it
	// had done, plus the hold time the gate measures, went past it. It is
	// refused at once or leaves the queue then, so that the permits go to
	// operations that can still finish in time.
	ErrWouldMissDeadline = errors.New("bulkhead: would miss its deadline")
	// ErrClosed: the gate was closed (by db.Close) before or while the
	// operation waited. It is not a rejection.
	ErrClosed = errors.New("bulkhead: closed")
	// ErrOutcomeUnknown: a COMMIT got no answer within the driver's bound
	// (pgxgate.EndGrace): it may or may not have taken effect. Not a
	// rejection, and not the caller's context error unless that context
	// ended too: check before retrying.
	ErrOutcomeUnknown = errors.New("bulkhead: outcome unknown")
)

// ErrTxStillOpen is returned for an operation on a connection whose
// transaction has not ended in the driver although its context has: a
// BeginTx, or a statement, which would run inside that transaction and
// vanish with its rollback. database/sql lets this happen on a *sql.Conn:
// once the transaction's context ended, Commit returns the context's error
// at once, and the driver's rollback runs a moment later on database/sql's
// own goroutine. It is not a rejection: try again, or take a fresh
// *sql.Conn.
var ErrTxStillOpen = errors.New("bulkhead: the connection's transaction has not ended yet (its context ended; database/sql is rolling it back)")

// RejectedError is the error of a rejection: which budget refused the
// operation, what it held then, its limits, and how long the operation
// waited. errors.Is matches it with ErrRejected and with its Cause. Treat
// it as read-only: an admission-full rejection that finds exactly B
// running and Q waiting is one value shared by every caller, so that
// rejecting under steady overload allocates nothing.
type RejectedError struct {
	Cause         error  // ErrAdmissionFull, ErrQueueTimeout or ErrWouldMissDeadline
	Workload      string // the workload whose budget refused it; "" for the global budget
	MaxConcurrent int    // B of that budget
	MaxQueue      int    // Q of that budget
	// Running and Waiting are what that budget held when it refused:
	// operations holding an execution permit, and admitted operations
	// waiting for one.
	Running, Waiting int
	Waited           time.Duration // time spent waiting; 0 for ErrAdmissionFull
	// Hold is the budget's estimate of an operation's hold time, which
	// ErrWouldMissDeadline weighed against the time left.
	Hold time.Duration
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
		return fmt.Sprintf("bulkhead: would miss its deadline%s after a wait of %v, with operations holding their permits %v: %s", budget, e.Waited, e.Hold, held)
	}
	return fmt.Sprintf("bulkhead: admission full%s: %s", budget, held)
}

// Is reports whether target is ErrRejected or the error's Cause.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected || target == e.Cause }

// canceledError is a driver's error returned after the caller's context
// ended: it matches both the context's error and the driver's, so that
// errors.Is(err, context.DeadlineExceeded) holds whatever the driver made
// of the cancellation, while errors.As still reaches the driver's error.
type canceledError struct{ ctx, err error }

func (e *canceledError) Error() string   { return e.ctx.Error() + ": " + e.err.Error() }
func (e *canceledError) Unwrap() []error { return []error{e.ctx, e.err} }

// ctxErr returns err, made to match ctx's error too if ctx ended. The
// errors database/sql itself acts on (driver.ErrSkip, driver.ErrBadConn,
// driver.ErrRemoveArgument, io.EOF) are returned as they are.
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
