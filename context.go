package bulkhead

import (
	"context"
	"time"
)

type opKey struct{}

// opOptions are what a context says about the operations run with it.
type opOptions struct {
	workload string
	wait     time.Duration // < 0: the budget's own QueueWait
}

func fromContext(ctx context.Context) opOptions {
	if o, ok := ctx.Value(opKey{}).(*opOptions); ok {
		return *o
	}
	return opOptions{wait: -1}
}

// WithWorkload returns a context whose operations also count against the
// named workload's budget (Policy.Workloads). An operation naming a workload
// the policy lacks passes the global budget alone: it is counted in
// Stats.UnknownWorkload and the name logged once (slog), not refused, for
// SetPolicy may drop a workload while contexts naming it still run.
func WithWorkload(ctx context.Context, name string) context.Context {
	o := fromContext(ctx)
	o.workload = name
	return context.WithValue(ctx, opKey{}, &o)
}

// WithQueueWait returns a context whose operations wait at most d, capped
// at MaxQueueWait, instead of the QueueWait; a negative d restores it.
func WithQueueWait(ctx context.Context, d time.Duration) context.Context {
	o := fromContext(ctx)
	o.wait = max(min(d, MaxQueueWait), -1) // any d < 0 is -1
	return context.WithValue(ctx, opKey{}, &o)
}

// WorkloadFromContext returns the workload named by ctx, if any.
func WorkloadFromContext(ctx context.Context) (string, bool) {
	o := fromContext(ctx)
	return o.workload, o.workload != ""
}
