// Package leakcheck finds goroutines a test binary left running: the
// root module's stand-in for go.uber.org/goleak, which it may not
// require (the root module requires nothing but golang.org/x/sync).
//
//	func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Run runs the tests and, if they passed, checks that no goroutine but
// the runtime's and the testing package's own is left, retrying for up to
// five seconds while goroutines that are ending finish. It returns the
// exit code: m.Run's, or 1 with the leaked stacks printed.
func Run(m *testing.M) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := Find(5 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Find returns an error listing the goroutines left running, other than
// the caller's and those of the runtime and the testing package, if any
// are still there after retrying for up to wait.
func Find(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	delay := time.Microsecond
	for {
		leaked := leaks()
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("leakcheck: %d goroutines left running:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(delay) // the goroutines that end need time, not a signal: this is the one place that polls
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// leaks returns the stacks of the goroutines that should not be running.
func leaks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 || benign(g) { // the first is the caller's own
			continue
		}
		out = append(out, g)
	}
	return out
}

// benign reports whether goroutine stack g belongs to the runtime or the
// testing package.
func benign(g string) bool {
	for _, s := range []string{
		"testing.(*M).", "testing.(*T).Run", "testing.tRunner", "testing.runFuzzing",
		"runtime.ensureSigM", "os/signal.signal_recv", "os/signal.loop", "runtime/trace.Start",
	} {
		if strings.Contains(g, s) {
			return true
		}
	}
	return false
}
