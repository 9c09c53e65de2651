package tests

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/jackc/pgx/v5/pgconn"
)

// dlDeadlineOnly has a deadline but never ends by itself: pgx and
// database/sql never cancel it, so whatever stops a statement run with it
// is the server.
type dlDeadlineOnly struct {
	context.Context
	d time.Time
}

func (c dlDeadlineOnly) Deadline() (time.Time, bool) { return c.d, true }

// dlShowMillis reads a PostgreSQL time setting (e.g. "200ms", "1s", "0")
// in milliseconds.
func dlShowMillis(t *testing.T, v string) int64 {
	t.Helper()
	if v == "0" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil {
		return d.Milliseconds()
	}
	if n, err := strconv.ParseInt(strings.TrimSuffix(v, "min"), 10, 64); err == nil && strings.HasSuffix(v, "min") {
		return n * 60000
	}
	t.Fatalf("cannot read the setting %q", v)
	return 0
}

// statement_timeout and lock_timeout are 32-bit milliseconds on the
// server: a deadline more than about 24.8 days away sets the largest, and
// BeginTx succeeds.
func TestPostgresDeadlineFartherThanTheServersLargestTimeoutSetsTheLargest(t *testing.T) {
	_, db := openGatedWith(t, bulkhead.Policy{MaxConcurrent: 1},
		bulkhead.WithPostgresDeadline(bulkhead.PostgresDeadline{LockTimeout: true}))
	ctx, cancel := context.WithTimeout(t.Context(), 30*24*time.Hour)
	defer cancel()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("BeginTx with 30 days left: %v", err)
	}
	defer tx.Rollback()
	var st, lt string
	if err := tx.QueryRowContext(ctx, "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&st, &lt); err != nil {
		t.Fatal(err)
	}
	if ms := dlShowMillis(t, st); ms != 2147483647 || dlShowMillis(t, lt) != ms {
		t.Fatalf("statement_timeout %q, lock_timeout %q; want 2147483647ms for both", st, lt)
	}
}

func TestPostgresDeadlineMakesTheServerStopAStatementNobodyWaitsFor(t *testing.T) {
	g, db := openGatedWith(t, bulkhead.Policy{MaxConcurrent: 2},
		bulkhead.WithPostgresDeadline(bulkhead.PostgresDeadline{LockTimeout: true}))
	m := newMonitor(t)
	pgWarm(t, t.Context(), db, 1)

	began := time.Now()
	ctx := dlDeadlineOnly{context.Background(), began.Add(200 * time.Millisecond)}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var st, lt string
	if err := tx.QueryRowContext(ctx, "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&st, &lt); err != nil {
		t.Fatal(err)
	}
	stMs, ltMs := dlShowMillis(t, st), dlShowMillis(t, lt)
	if stMs < 1 || stMs > 200 || ltMs != stMs {
		t.Fatalf("inside the transaction: statement_timeout %q, lock_timeout %q; want the same value in 1ms..200ms", st, lt)
	}
	start := time.Now()
	_, err = tx.ExecContext(ctx, "SELECT pg_sleep(2)")
	took := time.Since(start)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("pg_sleep(2) with %s left: %v, want SQLSTATE 57014 from the server", st, err)
	}
	// The server answered: the statement is over there, not only here.
	active := m.Active(t)
	var state string
	q := `SELECT coalesce(string_agg(state, ','), '') FROM pg_stat_activity WHERE application_name = $1 AND backend_type = 'client backend' AND state <> 'idle'`
	if err := m.db.QueryRowContext(t.Context(), q, m.app).Scan(&state); err != nil {
		t.Fatal(err)
	}
	t.Logf("statement_timeout inside the transaction %s (lock_timeout %s); pg_sleep(2) ended with 57014 after %v (%v after the caller's deadline was set to 200ms ahead); active statements right after: %d; backend state %q",
		st, lt, took.Round(time.Millisecond), time.Since(began).Round(time.Millisecond), active, state)
	if active != 0 || state != "idle in transaction (aborted)" {
		t.Fatalf("right after the error: %d active statements, backend %q; want none, aborted transaction", active, state)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	pgExpectIdle(t, g)
}

func TestPostgresDeadlineSetsNothingWithoutADeadlineAndOnlyForTheTransaction(t *testing.T) {
	_, db := openGatedWith(t, bulkhead.Policy{MaxConcurrent: 2},
		bulkhead.WithPostgresDeadline(bulkhead.PostgresDeadline{LockTimeout: true}))
	_, plainDB := openGatedWith(t, bulkhead.Policy{MaxConcurrent: 2}) // no deadline option
	bg := t.Context()
	c, err := db.Conn(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := func(what string, scan func(dest ...any) error) (string, string) {
		t.Helper()
		var st, lt string
		if err := scan(&st, &lt); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return st, lt
	}
	const q = "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
	defSt, defLt := read("session default", plainDB.QueryRowContext(bg, q).Scan)

	tx, err := c.BeginTx(bg, nil) // no deadline
	if err != nil {
		t.Fatal(err)
	}
	st, lt := read("transaction without a deadline", tx.QueryRowContext(bg, q).Scan)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if st != defSt || lt != defLt {
		t.Fatalf("without a deadline: statement_timeout %q, lock_timeout %q; want the defaults %q, %q", st, lt, defSt, defLt)
	}

	ctx, cancel := context.WithTimeout(bg, time.Hour)
	defer cancel()
	tx, err = c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, lt = read("transaction with an hour left", tx.QueryRowContext(ctx, q).Scan)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if ms := dlShowMillis(t, st); ms < 59*60000 || ms > 60*60000 || lt != st {
		t.Fatalf("with an hour left: statement_timeout %q, lock_timeout %q; want about an hour, both", st, lt)
	}
	// SET LOCAL: the next statement on the same connection has the defaults.
	st, lt = read("autocommit after the transaction", c.QueryRowContext(ctx, q).Scan)
	if st != defSt || lt != defLt {
		t.Fatalf("after the transaction on the same connection: %q, %q; want the defaults %q, %q", st, lt, defSt, defLt)
	}
}
