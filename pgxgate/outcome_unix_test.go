//go:build unix

package pgxgate_test

import (
	"errors"
	"syscall"
	"testing"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// A COMMIT that gets no answer (its backend stopped with SIGSTOP before it
// could read it) returns, after pgxgate.EndGrace, an error matching
// bulkhead.ErrOutcomeUnknown and not the caller's context error, which
// never ended; httpgate answers 500, not a retryable 503; the permit comes
// back with the connection closed.
func TestAnUnansweredCommitIsAnUnknownOutcomeNotTheCallersDeadline(t *testing.T) {
	cfg, _ := pgConfig(t, "outcome")
	g, db := openGate(t, cfg, bulkhead.Policy{MaxConcurrent: 1})
	ctx := t.Context()
	tx := testkit.Begin(t, ctx, db)
	pid := testkit.Scalar[int](t, ctx, tx, "SELECT pg_backend_pid()")
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP to backend %d: %v (the test must run as a user allowed to signal the server's processes, as .ci/run does)", pid, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT to backend %d: %v", pid, err)
			}
		}
	}
	defer resume()
	err := tx.Commit()
	resume()
	if !errors.Is(err, bulkhead.ErrOutcomeUnknown) {
		t.Fatalf("Commit with its backend stopped: %v, want an error matching ErrOutcomeUnknown", err)
	}
	commitAnswered500(t, ctx, err)
	if s := g.Stats(); s.Running != 0 {
		t.Errorf("Running %d after the Commit returned, want 0", s.Running)
	}
	t.Logf("Commit: %v", err)
}
