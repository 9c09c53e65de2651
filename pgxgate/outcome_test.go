package pgxgate_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// A COMMIT the server answered with an error has a known outcome: nothing
// was committed. Its deferred unique check waits on another session's
// uncommitted duplicate; that session either commits (23505 at once) or
// holds on past pgxgate.EndGrace, when pgxgate's cancel request makes the
// server abort the COMMIT (57014). Either way Commit returns the server's
// error as pgx does for a failed COMMIT (errors.As reaches the
// *pgconn.PgError), never ErrOutcomeUnknown nor a context error, and the
// connection stays open and idle for the next transaction.
func TestACommitTheServerAnsweredWithAnErrorReturnsItAndKeepsTheConnection(t *testing.T) {
	for _, c := range []struct {
		name, code  string
		otherCommit bool
	}{
		{"the other session commits", "23505", true},
		{"the other session holds on past EndGrace", "57014", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, _ := pgConfig(t, "answered")
			g, db := openGate(t, cfg, bulkhead.Policy{MaxConcurrent: 1})
			ctl, other := newMonitor(t), newMonitor(t)
			ctx := t.Context()
			table := fmt.Sprintf("pgxgate_answered_%d_%s", os.Getpid(), c.code)
			ctl.table(t, table, "id int UNIQUE DEFERRABLE INITIALLY DEFERRED, who text")

			otx := testkit.Begin(t, ctx, other.db)
			defer otx.Rollback()
			testkit.Exec(t, ctx, otx, "INSERT INTO "+table+" VALUES (1, 'other')")
			tx := testkit.Begin(t, ctx, db)
			pid := testkit.Scalar[int](t, ctx, tx, "INSERT INTO "+table+" VALUES (1, 'gated') RETURNING pg_backend_pid()")
			if c.otherCommit {
				// The other session commits once the COMMIT waits for it;
				// the probe's connection polls until then.
				go func() {
					var n int
					for n == 0 && ctx.Err() == nil {
						ctl.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1
							AND wait_event_type = 'Lock' AND query ILIKE 'commit'`, pid).Scan(&n)
					}
					if err := otx.Commit(); err != nil {
						t.Errorf("the other session's commit: %v", err)
					}
				}()
			}
			dials := g.Stats().Dials
			err := tx.Commit()
			t.Logf("Commit: %v", err)

			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != c.code {
				t.Errorf("Commit: %v, want the server's error with SQLSTATE %s reachable with errors.As", err, c.code)
			}
			if errors.Is(err, bulkhead.ErrOutcomeUnknown) {
				t.Errorf("Commit: %v matches ErrOutcomeUnknown: the server answered", err)
			}
			commitAnswered500(t, ctx, err)
			if s := g.Stats(); s.Running != 0 || s.BadConns != 0 {
				t.Errorf("stats after Commit: Running %d, BadConns %d; want 0 and 0", s.Running, s.BadConns)
			}
			var state string
			if err := ctl.db.QueryRowContext(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state); err != nil || state != "idle" {
				t.Errorf("the backend %d after Commit: state %q, %v; want it open and idle", pid, state, err)
			}
			if !c.otherCommit {
				testkit.Rollback(t, otx)
			}
			var next, gated int
			if err := db.QueryRowContext(ctx, "SELECT pg_backend_pid(), (SELECT count(*) FROM "+table+" WHERE who = 'gated')").Scan(&next, &gated); err != nil {
				t.Fatal(err)
			}
			if next != pid || g.Stats().Dials != dials {
				t.Errorf("the next operation ran on backend %d after %d dials, want %d after %d: the connection kept", next, g.Stats().Dials, pid, dials)
			}
			if gated != 0 {
				t.Errorf("%d rows of the failed transaction committed, want 0", gated)
			}
		})
	}
}

// A COMMIT whose reply never comes (the network drops everything after it
// was written, so the server committed) returns, after pgxgate.EndGrace
// and DeadlineDelay, an error matching bulkhead.ErrOutcomeUnknown, with no
// server error and no context error in its chain; pgx closed the
// connection and the gate drops it.
func TestACommitWhoseReplyIsLostIsAnUnknownOutcome(t *testing.T) {
	cfg, _ := pgConfig(t, "lost")
	var d lossyDialer
	cfg.DialFunc = d.dial
	t.Cleanup(d.closeAll) // pgx's background close waits 15 s for a reply that is never read
	g, db := openGate(t, cfg, bulkhead.Policy{MaxConcurrent: 1})
	ctl := newMonitor(t)
	ctx := t.Context()
	table := fmt.Sprintf("pgxgate_lost_%d", os.Getpid())
	ctl.table(t, table, "id int")

	tx := testkit.Begin(t, ctx, db)
	testkit.Exec(t, ctx, tx, "INSERT INTO "+table+" VALUES (1)")
	d.dropAfterCommit.Store(true)
	err := tx.Commit()
	t.Logf("Commit: %v", err)

	if !errors.Is(err, bulkhead.ErrOutcomeUnknown) {
		t.Errorf("Commit with its reply lost: %v, want an error matching ErrOutcomeUnknown", err)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		t.Errorf("Commit: %v reaches a server error, but the server never answered", err)
	}
	commitAnswered500(t, ctx, err)
	testkit.Await(t, "the gate drops the closed connection", func() bool {
		s := g.Stats()
		return s.Running == 0 && s.OpenConns == 0
	})
	var n int
	if err := ctl.db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 1 {
		t.Errorf("rows: %d, %v; want 1: the server received the COMMIT and committed", n, err)
	}
}

// lossyDialer dials the server for pgx (ConnConfig.DialFunc). Once
// dropAfterCommit is set, a connection that writes a COMMIT sends it, then
// loses everything: later writes vanish and what the server sends is
// never read (reads wait for pgx's deadline or Close).
type lossyDialer struct {
	dropAfterCommit atomic.Bool
	mu              sync.Mutex
	conns           []net.Conn
}

// pgx's COMMIT: a simple Query message, 'Q', the length (4 + 7), "commit\x00".
var commitMsg = []byte("Q\x00\x00\x00\x0bcommit\x00")

func (d *lossyDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.conns = append(d.conns, c)
	d.mu.Unlock()
	return &lossyConn{Conn: c, d: d}, nil
}

// closeAll closes every connection d dialed.
func (d *lossyDialer) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
}

type lossyConn struct {
	net.Conn
	d    *lossyDialer
	lost atomic.Bool
}

func (c *lossyConn) Write(b []byte) (int, error) {
	if c.lost.Load() {
		return len(b), nil
	}
	if c.d.dropAfterCommit.Load() && bytes.Contains(b, commitMsg) {
		c.lost.Store(true) // before the write: no byte of the reply is read
	}
	return c.Conn.Write(b)
}

func (c *lossyConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err != nil || !c.lost.Load() {
			return n, err
		}
	}
}
