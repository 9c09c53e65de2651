//go:build go1.25

package testkit

import "sync"

// Log collects values added from any goroutine, such as the events a
// gate reports. Its zero value is empty and ready to use.
type Log[T any] struct {
	mu  sync.Mutex
	got []T
}

// Add appends v.
func (l *Log[T]) Add(v T) {
	l.mu.Lock()
	l.got = append(l.got, v)
	l.mu.Unlock()
}

// List returns a copy of the values added so far, in order.
func (l *Log[T]) List() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]T(nil), l.got...)
}
