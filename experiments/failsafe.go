package main

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	fsbulkhead "github.com/failsafe-go/failsafe-go/bulkhead"
)

// The failsafe-go arms of the overload experiment: its bulkhead, and its
// adaptive limiter, each run through failsafe.With(...).Run as its
// documentation shows, the operation on a plain database/sql pool
// underneath.

// fsDo returns a runner of operations in policy p: a permit taken before
// op, given back when op returns (when database/sql returns, not when the
// server is done).
func fsDo(p failsafe.Policy[any]) func(context.Context, *sql.DB, opFunc) error {
	ex := failsafe.With[any](p)
	return func(ctx context.Context, db *sql.DB, op opFunc) error {
		return ex.WithContext(ctx).Run(func() error { return op(ctx, db) })
	}
}

// newFsBulkhead is failsafe-go's bulkhead of b permits, waited for at most
// wait.
func newFsBulkhead(b int, wait time.Duration) failsafe.Policy[any] {
	return fsbulkhead.NewBuilder[any](uint(b)).WithMaxWaitTime(wait).Build()
}

// newFsAdaptive is failsafe-go's adaptive limiter with limits 1 to ceil,
// starting at min(4, ceil), with queueing (rejection factors 2 and 3);
// with wait above 0, queued executions wait at most wait.
func newFsAdaptive(ceil int, wait time.Duration) failsafe.Policy[any] {
	bld := adaptivelimiter.NewBuilder[any]().WithLimits(1, uint(ceil), uint(min(4, ceil))).WithQueueing(2, 3)
	if wait > 0 {
		bld = bld.WithMaxWaitTime(wait)
	}
	return bld.Build()
}

// fsOutcome classifies failsafe-go's rejections: the bulkhead's after its
// wait (a timeout), the limiter's at once or after its wait (full).
func fsOutcome(err error) (o cli.Outcome, ok bool) {
	switch {
	case errors.Is(err, fsbulkhead.ErrFull):
		return cli.OutRejectedTimeout, true
	case errors.Is(err, adaptivelimiter.ErrExceeded):
		return cli.OutRejectedFull, true
	}
	return 0, false
}
