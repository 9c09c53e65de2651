//go:build go1.25

package leakcheck

import (
	"strings"
	"testing"
	"time"
)

func TestFindReportsAGoroutineLeftRunningAndNothingOnceItEnded(t *testing.T) {
	stop := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		<-stop // a goroutine a test forgot
	}()
	err := Find(10 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "TestFindReportsAGoroutineLeftRunningAndNothingOnceItEnded") {
		t.Fatalf("Find = %v, want the leaked goroutine's stack", err)
	}
	close(stop)
	<-ended
	if err := Find(5 * time.Second); err != nil {
		t.Fatalf("Find after the goroutine ended: %v", err)
	}
}
