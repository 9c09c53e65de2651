package tests

// An autocommit statement on a *sql.Conn whose transaction's context
// ended: database/sql's Commit returns the context's error at once and
// rolls the transaction back a moment later from its own goroutine. A
// statement sent in between would run inside the dying transaction and
// vanish with its rollback while reporting success. The gate refuses it
// (ErrTxStillOpen); plain database/sql runs it.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// dyingTxRounds runs rounds of: a transaction on a *sql.Conn, its context
// cancelled, Commit, then an autocommit INSERT of the round's number on
// the same *sql.Conn. It returns how many INSERTs reported success, how
// many of those rows are missing afterwards (lost writes), how many were
// refused with ErrTxStillOpen, and how many panicked inside database/sql.
//
// The panics are database/sql's own: when its rollback goroutine closes
// the *sql.Conn (it discards a connection whose transaction's context
// ended unless the driver has SessionResetter and Validator, and pgx lacks
// Validator), (*sql.Conn).grabConn can return the closed connection's nil
// driverConn to a concurrent ExecContext, which then dereferences it. The
// gate keeps the logical connection (it has both), so it never happens
// through the gate.
func dyingTxRounds(t *testing.T, db *sql.DB, setup *sql.DB, table string, ph func(int) string, rounds int) (ok, lost, refused, panicked int) {
	t.Helper()
	bg := t.Context()
	var reported []int
	for i := range rounds {
		c := testkit.Conn(t, bg, db)
		ctx, cancel := context.WithCancel(bg)
		tx := testkit.Begin(t, ctx, c)
		testkit.Exec(t, ctx, tx, "INSERT INTO "+table+" (v) VALUES (-1)")
		cancel()
		if err := tx.Commit(); err == nil {
			t.Fatalf("round %d: Commit after the context ended succeeded", i)
		}
		err := func() (err error) {
			defer func() {
				if v := recover(); v != nil {
					err = fmt.Errorf("panic: %v", v)
					panicked++
				}
			}()
			_, err = c.ExecContext(bg, "INSERT INTO "+table+" (v) VALUES ("+ph(1)+")", i)
			return err
		}()
		switch {
		case err == nil:
			ok++
			reported = append(reported, i)
		case errors.Is(err, bulkhead.ErrTxStillOpen):
			refused++
		}
		c.Close()
	}
	for _, i := range reported {
		if queryOne[int](t, bg, setup, "SELECT count(*) FROM "+table+" WHERE v = "+ph(1), i) == 0 {
			lost++
		}
	}
	var stray int
	if err := setup.QueryRowContext(bg, "SELECT count(*) FROM "+table+" WHERE v = -1").Scan(&stray); err != nil || stray != 0 {
		t.Fatalf("%d rows of the cancelled transactions committed (%v), want none", stray, err)
	}
	return ok, lost, refused, panicked
}

func TestAnAutocommitStatementIsRefusedWhileTheConnectionsTransactionIsDying(t *testing.T) {
	const rounds = 50
	for _, d := range igDrivers() {
		if d.name == "sqlite-modernc" || d.name == "mariadb-interpolateParams" {
			continue // one PostgreSQL and one MariaDB driver say it
		}
		t.Run(d.name, func(t *testing.T) {
			inner, setup := d.open(t)
			plainTable, gatedTable := tempTable(t, setup, "v int"), tempTable(t, setup, "v int")

			ok, lost, _, panicked := dyingTxRounds(t, setup, setup, plainTable, d.ph, rounds)
			t.Logf("figures: plain database/sql: %d of %d INSERTs reported success, %d of them lost with the dying transaction; %d panicked in database/sql", ok, rounds, lost, panicked)

			g, db := gateOn(t, inner, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: 5 * time.Second})
			ok, lost, refused, panicked := dyingTxRounds(t, db, setup, gatedTable, d.ph, rounds)
			t.Logf("figures: gated: %d of %d INSERTs reported success, %d lost, %d refused with ErrTxStillOpen", ok, rounds, lost, refused)
			if lost != 0 || panicked != 0 {
				t.Errorf("through the gate, %d INSERTs reported success and were lost, %d panicked", lost, panicked)
			}
			if refused == 0 {
				t.Errorf("through the gate, no INSERT met the dying transaction (%d of %d succeeded): the rounds show nothing", ok, rounds)
			}
			awaitState(t, "permits back", func() bool { return g.Stats().Running == 0 })
		})
	}
}
