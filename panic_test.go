//go:build go1.25

package bulkhead_test

import (
	"context"
	"strings"
	"testing"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// pnMustPanic fails the test unless f panics.
func pnMustPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if v := recover(); v == nil {
			t.Error("the driver's panic did not propagate")
		}
	}()
	f()
}

// It runs between taking permits and registering their release: the gate
// recovers it and logs it through slog.Default.
func TestAPanicInAnEventCallbackIsLoggedAndLosesNoPermitOrConnection(t *testing.T) {
	logs := captureLog(t)
	panicky := func(bulkhead.Event) { panic("metrics bug") }
	for _, c := range []struct {
		name string
		ev   bulkhead.Events
	}{
		{"OnAdmit", bulkhead.Events{OnAdmit: panicky}},
		{"OnRelease", bulkhead.Events{OnRelease: panicky}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := fkOpen(t, nil, fkB1, bulkhead.WithEvents(c.ev))
			g, db := e.g, e.db
			ctx := context.Background()
			for i := range 3 { // B+Q=1: a lost permit or slot would reject the next round
				if _, err := db.ExecContext(ctx, "UPDATE x"); err != nil {
					t.Fatalf("exec %d: %v", i, err)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatalf("begin %d: %v", i, err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatalf("commit %d: %v", i, err)
				}
			}
			if s := g.Stats(); s.Running != 0 || s.OpenConns != 1 || s.Admitted != 6 {
				t.Errorf("after 6 operations: Running %d, OpenConns %d, Admitted %d; want 0, 1, 6", s.Running, s.OpenConns, s.Admitted)
			}
			if !strings.Contains(logs.String(), "bulkhead: event callback panicked") {
				t.Errorf("the recovered panic was not logged; log: %q", logs.String())
			}
		})
	}
}

// Outside any gated operation: the gate closes the connection, and
// database/sql's next use of it dials anew.
func TestADriverPanicInResetSessionLosesNoConnectionSlot(t *testing.T) {
	e := fkOpen(t, nil, fkB1)
	fc, g, db := e.fc, e.g, e.db
	ctx := context.Background()
	testkit.Exec(t, ctx, db, "UPDATE x")
	fc.PanicNext(fakedb.OpResetSession, 1, "driver bug")
	pnMustPanic(t, func() { db.ExecContext(ctx, "UPDATE x") })
	if got := g.Stats().OpenConns; got != 0 {
		t.Errorf("after the panic the gate counts %d open connections, want 0 (the lost one closed)", got)
	}
	if _, err := db.ExecContext(ctx, "UPDATE x"); err != nil {
		t.Fatalf("after a ResetSession panic: %v", err)
	}
	if s := g.Stats(); s.Running != 0 || s.OpenConns != 1 {
		t.Errorf("Running %d, OpenConns %d; want 0, 1", s.Running, s.OpenConns)
	}
}

// Even when its caller abandons it, so that database/sql never rolls it back.
func TestADriverPanicInsideATransactionGivesTheTransactionsPermitsBack(t *testing.T) {
	e := fkOpen(t, nil, fkB1)
	fc, g, db := e.fc, e.g, e.db
	ctx := context.Background()
	tx := testkit.Begin(t, ctx, db)
	fc.PanicNext(fakedb.OpExec, 1, "driver bug")
	pnMustPanic(t, func() { tx.ExecContext(ctx, "UPDATE x") })
	if s := g.Stats(); s.Running != 0 || s.OpenConns != 0 {
		t.Errorf("after the panic: Running %d, OpenConns %d; want 0, 0", s.Running, s.OpenConns)
	}
	if _, err := db.ExecContext(ctx, "UPDATE x"); err != nil {
		t.Fatalf("next operation: %v", err)
	}
	if err := tx.Rollback(); err == nil {
		t.Log("rollback of the lost transaction reported no error")
	}
	if s := g.Stats(); s.Running != 0 || s.Admitted != 2 {
		t.Errorf("at the end: Running %d, Admitted %d; want 0, 2", s.Running, s.Admitted)
	}
}
