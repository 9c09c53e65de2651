//go:build go1.25

package bulkhead

import (
	"context"
	"time"
)

// The budget as the internal tests drive it: one budget alone, as a gate
// without workloads passes it.

type limiter = budget

func newLimiter(name string, p Policy) *budget {
	l := newBudget(name)
	l.resize(p.MaxConcurrent, p.MaxQueue, p.QueueWait, p.DryRun, 0)
	return l
}

// acquire takes both permits of l with its own queue wait, counting the
// operation as admitted; waited is the time spent waiting.
func (l *budget) acquire(ctx context.Context) (waited time.Duration, err error) {
	l.mu.Lock()
	ps := passage{limit: l.wait}
	l.mu.Unlock()
	err = ps.acquire(ctx, []*budget{l})
	if err == nil {
		l.nAdmitted.Add(1)
	}
	return ps.waited(), err
}

// counts returns the free execution permits and the waiters; l.mu is held.
func (l *budget) counts() (free, waiting int) { return l.b - l.running, l.waiting }

// admittedN returns the admission permits held.
func (l *budget) admittedN() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(l.admitted)
}

// The variable names and the lookup form the policy tests were written
// with.
const (
	EnvMaxConcurrent = envB
	EnvMaxQueue      = envQ
	EnvQueueWait     = envWait
	EnvDryRun        = envDryRun
	EnvWorkloads     = envWorkloads
)

// PolicyFromLookup is PolicyFromEnviron with the known variables looked
// up one by one.
func PolicyFromLookup(base Policy, lookup func(string) (string, bool)) (Policy, error) {
	var environ []string
	for _, k := range envKnown {
		if v, ok := lookup(k); ok {
			environ = append(environ, k+"="+v)
		}
	}
	return PolicyFromEnviron(base, environ)
}
