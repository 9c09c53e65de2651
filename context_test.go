//go:build go1.25

package bulkhead_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

func TestWithQueueWaitOverridesThePolicysAndTheWorkloadsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: 70 * time.Millisecond,
			Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour}}}
		r := wlOpen(t, p)
		bg := context.Background()
		h1, h2 := r.exec(bg, "h1"), r.exec(bulkhead.WithWorkload(bg, "batch"), "h2")
		synctest.Wait()
		batch := bulkhead.WithWorkload(bg, "batch")
		for _, c := range []struct {
			name     string
			ctx      context.Context
			want     time.Duration
			workload string // the budget that refuses
		}{
			{"WithQueueWait(30ms)", bulkhead.WithQueueWait(bg, 30*time.Millisecond), 30 * time.Millisecond, ""},
			{"WithQueueWait(0)", bulkhead.WithQueueWait(bg, 0), 0, ""},
			{"WithQueueWait(-1) restores the policy's", bulkhead.WithQueueWait(bulkhead.WithQueueWait(bg, time.Millisecond), -1), 70 * time.Millisecond, ""},
			{"WithQueueWait(2h) is capped at MaxQueueWait", bulkhead.WithQueueWait(bg, 2*time.Hour), bulkhead.MaxQueueWait, ""},
			{"batch with WithQueueWait(20ms)", bulkhead.WithQueueWait(batch, 20*time.Millisecond), 20 * time.Millisecond, "batch"},
			{"batch without: the workload's hour", batch, time.Hour, "batch"},
		} {
			start := time.Now()
			_, err := r.db.ExecContext(c.ctx, "quick")
			var re *bulkhead.RejectedError
			if !errors.As(err, &re) || !errors.Is(err, bulkhead.ErrQueueTimeout) {
				t.Fatalf("%s: %v, want a queue timeout", c.name, err)
			}
			if re.Waited != c.want || time.Since(start) != c.want || re.Workload != c.workload {
				t.Fatalf("%s: %+v after %v, want %v waited by %q", c.name, re, time.Since(start), c.want, c.workload)
			}
		}
		// With a deadline nearer than the wait, the deadline ends the wait
		// as a cancellation, not a rejection.
		ctx, cancel := context.WithTimeout(bulkhead.WithQueueWait(bg, time.Second), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, err := r.db.ExecContext(ctx, "quick"); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, bulkhead.ErrRejected) || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("WithQueueWait(1s) and 100ms left: %v after %v, want the deadline's DeadlineExceeded after 100ms", err, time.Since(start))
		}
		r.done(t, h1, h2)
		r.balanced(t)
	})
}
