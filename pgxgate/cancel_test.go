package pgxgate_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
	"github.com/dbbulkhead/bulkhead/pgxgate"
)

// cancelRequestCode opens a cancel request packet (protocol 1234.5678).
const cancelRequestCode = 80877102

// lateCancels is a dialer whose connections deliver a cancel request
// delay after it was written, as a server too busy to take it at once: a
// cancel request is handled as it arrives, by signalling the backend,
// whatever that backend runs then.
type lateCancels struct {
	delay time.Duration
	mu    sync.Mutex
	ended bool // the test ended: nothing is delayed any more
	wg    sync.WaitGroup
}

// later runs f on a goroutine the end of the test waits for, and reports
// true, unless the test ended.
func (l *lateCancels) later(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.wg.Go(f)
	return true
}

// end waits for what later started; from then on nothing is delayed.
func (l *lateCancels) end() {
	l.mu.Lock()
	l.ended = true
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *lateCancels) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lateCancelConn{Conn: c, l: l}, nil
}

// lateCancelConn delivers its cancel request late; the request stays on
// its way when the client closes the connection or stops reading.
type lateCancelConn struct {
	net.Conn
	l       *lateCancels
	written bool
	sent    chan struct{} // closed once a late cancel request was delivered
}

func (c *lateCancelConn) Write(b []byte) (int, error) {
	first := !c.written
	c.written = true
	if first && len(b) >= 8 && binary.BigEndian.Uint32(b[4:8]) == cancelRequestCode {
		p := append([]byte(nil), b...)
		sent := make(chan struct{})
		if c.l.later(func() {
			defer close(sent)
			time.Sleep(c.l.delay)
			c.Conn.Write(p)
		}) {
			c.sent = sent
			return len(b), nil
		}
	}
	return c.Conn.Write(b)
}

func (c *lateCancelConn) Close() error {
	if c.sent == nil {
		return c.Conn.Close()
	}
	sent := c.sent
	if !c.l.later(func() {
		<-sent
		c.Conn.SetReadDeadline(time.Now().Add(time.Second))
		c.Conn.Read(make([]byte, 1)) // the server's end of the request
		c.Conn.Close()
	}) {
		<-sent
		return c.Conn.Close()
	}
	return nil
}

// A cancel request the server takes late stops no later statement: the
// connection whose statement a caller gave up on is used again only once
// the server acknowledged the cancel request (it closed the cancel
// connection, having signalled the backend), as libpq's PQcancel waits,
// however soon the statement ended on its own; until then the statement's
// permits are held.
func TestACancelRequestTheServerTakesLateStopsNoLaterStatement(t *testing.T) {
	for _, c := range []struct {
		name  string
		delay time.Duration
	}{
		{"acknowledged late", 300 * time.Millisecond},
		// past CancelGrace: the connection is closed, the next statement
		// runs on another
		{"not acknowledged", pgxgate.CancelGrace + 300*time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, _ := pgConfig(t, "late")
			late := &lateCancels{delay: c.delay}
			t.Cleanup(late.end)
			cfg.DialFunc = late.dial
			g, db := openGate(t, cfg, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 5 * time.Second})
			testkit.Exec(t, t.Context(), db, "SELECT 1")
			rounds := 2
			if c.delay > pgxgate.CancelGrace {
				rounds = 1
			}
			for i := range rounds {
				// The caller gives up at 20 ms; the statement ends on its
				// own at 100 ms, before the server takes the cancel request.
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
				_, err := db.ExecContext(ctx, "SELECT pg_sleep(0.1)")
				cancel()
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) {
					t.Fatalf("round %d: the statement given up on: %v, want it done or its context's error", i, err)
				}
				start := time.Now()
				if _, err := db.ExecContext(t.Context(), "SELECT pg_sleep(0.4)"); err != nil {
					t.Fatalf("round %d: the next statement, whose caller never gave up: %v after %v, want it done (%+v)", i, err, time.Since(start).Round(time.Millisecond), g.Stats())
				}
			}
			t.Logf("figures: %+v", g.Stats())
		})
	}
}
