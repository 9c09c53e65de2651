//go:build go1.25

package fleet

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// A member has no share before its first round (and when members
// outnumber T): its operations are rejected at once, but Ping reaches the
// database, so that a readiness probe passes while the database is up.
func TestAMemberWithNoSharePingsTheDatabase(t *testing.T) {
	g := modelGate(t, newMemLocks(), "ping", bulkhead.Policy{MaxConcurrent: 2}, 0, nil)
	if err := g.m.Gate().Cap(context.Background(), 0, 0); err != nil { // as before a first round
		t.Fatal(err)
	}
	if err := g.db.Ping(); err != nil {
		t.Fatalf("ping with no share: %v", err)
	}
}

// A *sql.Conn keeps its server connection, whatever happens to its
// statements: a connection is tagged before its first use, never again,
// so that a statement cut off by its deadline cannot move the *sql.Conn
// (its LISTEN, SET, temporary tables) to another server connection.
func TestASQLConnKeepsItsServerConnectionWhenAStatementIsCutOff(t *testing.T) {
	fc := fakedb.New()
	ctx := context.Background()
	c := testkit.Conn(t, ctx, modelGate(t, newMemLocks(), "pinned", bulkhead.Policy{MaxConcurrent: 2}, 0, fc).db)
	defer c.Close()
	id := func() int64 {
		var n int64
		if err := c.Raw(func(dc any) error {
			inner, err := bulkhead.Unwrap(dc)
			if err != nil {
				return err
			}
			n = fc.ConnOf(inner).ID()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := id()
	b := fc.Block(fakedb.OpExec)
	cut, cancel := context.WithCancel(ctx)
	done := testkit.GoExec(cut, c, "UPDATE t")
	b.Wait(1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cut-off statement: %v", err)
	}
	b.Release()
	testkit.Exec(t, ctx, c, "UPDATE t")
	if after := id(); after != before {
		t.Fatalf("the *sql.Conn moved from server connection %d to %d", before, after)
	}
}

// firstRound waits until m's loop started its first round.
func firstRound(t *testing.T, m *Member) {
	t.Helper()
	for i := 0; m.rounds.Load() == 0; i++ {
		if i == 1e7 {
			t.Fatal("the fleet loop's first round did not start")
		}
		runtime.Gosched()
	}
}
