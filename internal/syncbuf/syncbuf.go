// Package syncbuf is a bytes.Buffer that goroutines may write while
// another reads it: the tests' log and output collectors.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer with its methods serialised. The zero value is
// an empty buffer ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
