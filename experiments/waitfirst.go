package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// waitFirst is the overload experiment's "waitfirst" configuration: the
// bulkhead most libraries offer (failsafe-go's, resilience4j's
// semaphore bulkhead), wrapped around a plain pool. A request waits for one
// of b permits, in FIFO order, for at most wait, before it takes a
// connection from database/sql's pool; the queue has no bound, and a
// request that waited for wait fails. It starts no goroutine.
type waitFirst struct {
	b    int
	wait time.Duration

	mu      sync.Mutex
	running int
	queue   []chan struct{} // FIFO; a closed channel is a granted permit
}

// errWaitFirstTimeout wraps bulkhead.ErrQueueTimeout so that the
// experiment counts it as the gate's queue timeouts are counted.
var errWaitFirstTimeout = fmt.Errorf("wait-before-checkout bulkhead: %w", bulkhead.ErrQueueTimeout)

// do runs op on db once it holds a permit.
func (w *waitFirst) do(ctx context.Context, db *sql.DB, op func(context.Context, *sql.DB) error) error {
	if err := w.acquire(ctx); err != nil {
		return err
	}
	defer w.release()
	return op(ctx, db)
}

func (w *waitFirst) acquire(ctx context.Context) error {
	w.mu.Lock()
	if w.running < w.b && len(w.queue) == 0 {
		w.running++
		w.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	w.queue = append(w.queue, ch)
	w.mu.Unlock()

	t := time.NewTimer(w.wait)
	defer t.Stop()
	var err error
	select {
	case <-ch:
		return nil
	case <-t.C:
		err = errWaitFirstTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-ch: // granted as the wait ended: keep it
		return nil
	default:
	}
	for i, c := range w.queue {
		if c == ch {
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			break
		}
	}
	return err
}

func (w *waitFirst) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) > 0 {
		close(w.queue[0]) // the permit passes to the first in line
		w.queue = w.queue[1:]
		return
	}
	w.running--
}
