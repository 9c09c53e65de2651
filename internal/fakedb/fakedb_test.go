//go:build go1.25

package fakedb_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

func TestEveryVariantImplementsExactlyItsInterfaces(t *testing.T) {
	ctx := context.Background()
	for _, m := range fakedb.ConnVariants() {
		fc := fakedb.New()
		fc.Conn = m
		dc, err := fc.Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := fakedb.ConnIfacesOf(dc); got != m {
			t.Fatalf("conn %v implements %v", m, got)
		}
		if fc.ConnOf(dc) == nil {
			t.Fatalf("ConnOf(conn %v) = nil", m)
		}
		dc.Close()
	}
	for _, m := range fakedb.StmtVariants() {
		fc := fakedb.New()
		fc.Stmt = m
		dc, _ := fc.Connect(ctx)
		s, err := dc.Prepare("SELECT 1")
		if err != nil {
			t.Fatal(err)
		}
		if got := fakedb.StmtIfacesOf(s); got != m {
			t.Fatalf("stmt %v implements %v", m, got)
		}
	}
	for _, m := range fakedb.RowsVariants() {
		fc := fakedb.New()
		fc.Rows = m
		dc, _ := fc.Connect(ctx)
		r, err := dc.(driver.QueryerContext).QueryContext(ctx, "SELECT 1", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := fakedb.RowsIfacesOf(r); got != m {
			t.Fatalf("rows %v implements %v", m, got)
		}
	}
}

// covers fails the test unless masks, of n interfaces, hold all and none,
// and every two interfaces in all four ways.
func covers[M ~uint8 | ~uint16](t *testing.T, masks []M, n int) {
	t.Helper()
	all := M(1)<<n - 1
	if !slices.Contains(masks, 0) || !slices.Contains(masks, all) {
		t.Errorf("variants %v: want none and all among them", masks)
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			seen := map[[2]bool]bool{}
			for _, m := range masks {
				seen[[2]bool{m&(1<<i) != 0, m&(1<<j) != 0}] = true
			}
			if len(seen) != 4 {
				t.Errorf("variants %v: interfaces %d and %d are on and off in %d ways, want 4", masks, i, j, len(seen))
			}
		}
	}
}

func TestTheVariantsTakeEveryTwoInterfacesInAllFourWays(t *testing.T) {
	covers(t, fakedb.ConnVariants(), 10)
	covers(t, fakedb.StmtVariants(), 4)
	covers(t, fakedb.RowsVariants(), 6)
	for _, m := range []fakedb.ConnIface{ // the driver tests' own
		fakedb.ConnAll &^ (fakedb.ConnExecerContext | fakedb.ConnExecer),
		fakedb.ConnAll &^ (fakedb.ConnExecerContext | fakedb.ConnExecer | fakedb.ConnQueryerContext | fakedb.ConnQueryer),
	} {
		if !slices.Contains(fakedb.ConnVariants(), m) {
			t.Errorf("conn %v is not a variant", m)
		}
	}
}

func TestAMaskThatIsNoVariantPanicsNamingIt(t *testing.T) {
	fc := fakedb.New()
	fc.Conn = fakedb.ConnPinger
	defer func() {
		msg, _ := recover().(string)
		if !strings.HasPrefix(msg, "fakedb: Connector.Conn = Pinger is not a variant") || !strings.Contains(msg, fakedb.ConnAll.String()) {
			t.Fatalf("Connect with conn Pinger recovered %q, want a panic naming the mask and the variants", msg)
		}
	}()
	fc.Connect(context.Background())
}

func TestQueriesReturnTheirValuesThroughDatabaseSQL(t *testing.T) {
	fc := fakedb.New()
	db := sql.OpenDB(fc)
	defer db.Close()
	var a, b int64
	var s string
	if err := db.QueryRow("SELECT 42, ?", int64(7)).Scan(&a, &b); err != nil || a != 42 || b != 7 {
		t.Fatalf("got %d %d %v, want 42 7", a, b, err)
	}
	fc.Define("names", fakedb.ResultSet{Columns: []fakedb.Column{{Name: "name"}}, Rows: [][]driver.Value{{"x"}, {"y"}}})
	rows, err := db.Query("names")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil || !reflect.DeepEqual(got, []string{"x", "y"}) {
		t.Fatalf("got %q %v", got, err)
	}
	if fc.Count(fakedb.OpRowsClose) != 2 {
		t.Fatalf("rows closed %d times, want 2", fc.Count(fakedb.OpRowsClose))
	}
	rows, err = db.Query("SELECT 1; SELECT 2")
	if err != nil {
		t.Fatal(err)
	}
	var vals []int64
	for {
		for rows.Next() {
			rows.Scan(&a)
			vals = append(vals, a)
		}
		if !rows.NextResultSet() {
			break
		}
	}
	rows.Close()
	if !reflect.DeepEqual(vals, []int64{1, 2}) {
		t.Fatalf("result sets gave %v, want [1 2]", vals)
	}
	if _, err := db.Query("UPDATE t"); err == nil {
		t.Fatal("undefined non-SELECT query succeeded")
	}
}

func TestFaultsBarriersAndHooks(t *testing.T) {
	fc := fakedb.New()
	db := sql.OpenDB(fc)
	defer db.Close()
	fc.FailNext(fakedb.OpExec, 2, driver.ErrBadConn)
	if _, err := db.Exec("x"); err != nil {
		t.Fatalf("exec after 2 ErrBadConn: %v (database/sql retries)", err)
	}
	if n := fc.Count(fakedb.OpExec); n != 3 {
		t.Fatalf("%d execs, want 3", n)
	}
	boom := errors.New("boom")
	fc.SetHook(func(_ context.Context, op fakedb.Op, q string) error {
		if op == fakedb.OpExec && q == "fail" {
			return boom
		}
		return nil
	})
	if _, err := db.Exec("fail"); !errors.Is(err, boom) {
		t.Fatalf("hook error: got %v", err)
	}
	fc.SetHook(nil)
	fc.PanicNext(fakedb.OpExec, 1, "kaboom")
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Fatalf("recovered %v, want kaboom", r)
			}
		}()
		db.Exec("x")
	}()
	b := fc.Block(fakedb.OpCommit)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- tx.Commit() }()
	b.Wait(1)
	if b.Inside() != 1 {
		t.Fatalf("inside = %d, want 1", b.Inside())
	}
	b.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b = fc.Block(fakedb.OpExec)
	go func() { _, err := db.ExecContext(ctx, "x"); done <- err }()
	b.Wait(1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("blocked exec with cancelled ctx: %v", err)
	}
	b.Release()
}

func TestExecAndBeginAllocateNothing(t *testing.T) {
	fc := fakedb.New()
	ctx := context.Background()
	dc, _ := fc.Connect(ctx)
	e := dc.(driver.ExecerContext)
	b := dc.(driver.ConnBeginTx)
	n := testing.AllocsPerRun(100, func() {
		e.ExecContext(ctx, "x", nil)
		tx, _ := b.BeginTx(ctx, driver.TxOptions{})
		tx.Commit()
	})
	if n != 0 {
		t.Fatalf("%v allocations per exec+begin+commit, want 0", n)
	}
	q := dc.(driver.QueryerContext)
	dest := make([]driver.Value, 1)
	n = testing.AllocsPerRun(100, func() {
		r, _ := q.QueryContext(ctx, "SELECT 42", nil)
		r.Columns()
		r.Next(dest)
		r.Close()
	})
	if n != 1 {
		t.Fatalf("%v allocations per query, want 1 (the rows)", n)
	}
}
