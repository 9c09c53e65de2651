//go:build go1.25

package bulkhead_test

import (
	"log/slog"
	"os"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/dbbulkhead/bulkhead/internal/leakcheck"
	"github.com/dbbulkhead/bulkhead/internal/syncbuf"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// The root module's tests run on the in-process fake driver alone; the
// real-server tests are in the tests module (tests/).

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

// awaitState waits until cond holds, polling state without sleeping
// (testkit.Await).
func awaitState(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.Await(t, what, cond)
}

// inParallel runs f each times on each of workers goroutines, a goroutine
// stopping at its first error, and fails the test on any error.
func inParallel(t *testing.T, workers, each int, f func() error) {
	t.Helper()
	var g errgroup.Group
	for range workers {
		g.Go(func() error {
			for range each {
				if err := f(); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// captureLog sends slog.Default's records, as text, to the buffer it
// returns, until the end of the test.
func captureLog(t *testing.T) *syncbuf.Buffer {
	var buf syncbuf.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return &buf
}
