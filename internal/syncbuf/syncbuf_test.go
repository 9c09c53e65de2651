package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writers and a reader at once (run under -race): every write lands whole.
func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				b.Write([]byte("ab\n"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("ab\n", 400) {
		t.Fatalf("%d bytes, want 400 whole lines", len(got))
	}
}
