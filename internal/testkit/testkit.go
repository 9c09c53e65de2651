//go:build go1.25

// Package testkit holds the helpers the tests of every module of the
// repository share: waiting on state without sleeping, goroutines that
// repeat work until halted, and measuring what parked goroutines cost.
// It imports nothing of the gate, so that the gate's own internal tests
// may use it.
package testkit

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// Bound is how long Await and Recv wait before they fail the test: it
// turns a hang into a failure and never measures time.
const Bound = 30 * time.Second

// Await waits until cond holds, polling state without sleeping. It fails
// the test, saying it gave up waiting until what, only after Bound.
func Await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting until %s", what)
		}
		runtime.Gosched()
	}
}

// Recv returns the value on ch, failing the test, saying what never
// returned, if none comes within Bound.
func Recv[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Bound):
		t.Fatalf("%s never returned", what)
		var zero T
		return zero
	}
}

// Repeat calls body on each of n goroutines, again and again, until body
// returns false or halt is called; halt returns once every goroutine has
// ended. The calls of goroutine c get i = c, c+n, c+2n, … so that the
// calls of all of them together count up from 0.
func Repeat(n int, body func(i int) bool) (halt func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range n {
		wg.Go(func() {
			for i := c; ; i += n {
				select {
				case <-stop:
					return
				default:
				}
				if !body(i) {
					return
				}
			}
		})
	}
	return func() { close(stop); wg.Wait() }
}

// Waiters is what MeasureWaiters needs of a kind of waiter.
type Waiters struct {
	Hold   func()     // take the only permit
	Wait   func()     // one waiter: block until it gets a permit, then give it back
	Parked func() int // how many waiters are blocked now
	Free   func()     // give back the permit Hold took
}

// MeasureWaiters runs, b.N times: hold the permit, start n goroutines
// running Wait, wait (yielding) until all n are parked, measure, then
// free the permit and wait for the goroutines to end. It reports the
// heap and stack memory each parked waiter takes, as bytes/waiter.
func MeasureWaiters(b *testing.B, n int, w Waiters) {
	b.ReportAllocs()
	var total float64
	runs := 0
	for b.Loop() {
		w.Hold()
		before := memInUse()
		var wg sync.WaitGroup
		for range n {
			wg.Go(w.Wait)
		}
		for limit := time.Now().Add(time.Minute); w.Parked() < n; runtime.Gosched() {
			if time.Now().After(limit) {
				b.Fatalf("%d of %d waiters parked after a minute", w.Parked(), n)
			}
		}
		total += float64(memInUse()-before) / float64(n)
		runs++
		w.Free()
		wg.Wait()
	}
	b.ReportMetric(total/float64(runs), "bytes/waiter")
}

// memInUse is the heap and stack memory in use, after a GC.
func memInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}
