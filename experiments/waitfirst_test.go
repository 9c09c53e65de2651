package main

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// awaitQueued waits until n requests wait in w's queue.
func awaitQueued(t *testing.T, w *waitFirst, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		q := len(w.queue)
		w.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %d queued requests (%d queued)", n, q)
		}
		runtime.Gosched()
	}
}

func TestWaitFirstGrantsItsPermitsInArrivalOrderAndTimesOutAsAQueueTimeout(t *testing.T) {
	w := &waitFirst{b: 1, wait: time.Hour}
	if err := w.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Three requests queue behind the one running, in this order.
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			if err := w.do(context.Background(), nil, func(context.Context, *sql.DB) error {
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				return nil
			}); err != nil {
				t.Error(err)
			}
		})
		awaitQueued(t, w, i+1)
	}
	w.release()
	wg.Wait()
	if len(order) != 3 || order[0] != 0 || order[1] != 1 || order[2] != 2 {
		t.Fatalf("ran in the order %v, want [0 1 2]", order)
	}
	if w.running != 0 || len(w.queue) != 0 {
		t.Fatalf("after all: %d running, %d queued, want none", w.running, len(w.queue))
	}

	// A wait that runs out is a queue timeout; a context that ends is the
	// context's error; neither keeps a place in the queue.
	w = &waitFirst{b: 1, wait: time.Millisecond}
	if err := w.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := w.acquire(context.Background()); !errors.Is(err, bulkhead.ErrQueueTimeout) {
		t.Fatalf("after the wait: %v, want a match for bulkhead.ErrQueueTimeout", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.wait = time.Hour
	if err := w.acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v, want context.Canceled", err)
	}
	if len(w.queue) != 0 {
		t.Fatalf("%d left in the queue, want 0", len(w.queue))
	}
	w.release()
	if w.running != 0 {
		t.Fatalf("%d running after the release, want 0", w.running)
	}
}
