//go:build go1.25

package httpgate_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/gatetest"
	"github.com/dbbulkhead/bulkhead/internal/leakcheck"
	"github.com/dbbulkhead/bulkhead/internal/testkit"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/httpgate"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

// busyDB opens a gate on the fake driver with B=1, Q=1 and a 1ns queue wait,
// and holds its one execution permit with an open transaction for the
// rest of the test: the next operation is rejected at once with a queue
// timeout, the one after (while it still waits) with admission full.
func busyDB(t *testing.T) *sql.DB {
	t.Helper()
	_, db := gatetest.Open(t, fakedb.New(), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond})
	tx := testkit.Begin(t, t.Context(), db)
	t.Cleanup(func() { tx.Rollback() })
	return db
}

// dbErrors returns real errors of gated calls: a queue-timeout rejection,
// an admission-full rejection, a call on a closed gate, a cancelled and a
// timed-out call.
func dbErrors(t *testing.T) map[string]error {
	t.Helper()
	errs := map[string]error{}
	db := busyDB(t)
	_, errs["queue timeout"] = db.ExecContext(t.Context(), "UPDATE t SET v = 1")
	if !errors.Is(errs["queue timeout"], bulkhead.ErrQueueTimeout) {
		t.Fatalf("busy gate: %v, want a queue timeout", errs["queue timeout"])
	}

	g, full := gatetest.Open(t, fakedb.New(), bulkhead.Policy{MaxConcurrent: 1})
	tx := testkit.Begin(t, t.Context(), full)
	_, errs["admission full"] = full.ExecContext(t.Context(), "UPDATE t SET v = 1")
	if !errors.Is(errs["admission full"], bulkhead.ErrAdmissionFull) {
		t.Fatalf("full gate: %v, want admission full", errs["admission full"])
	}
	tx.Rollback()
	g.Close() // as db.Close does, but with the *sql.DB still open
	_, errs["closed"] = full.ExecContext(t.Context(), "UPDATE t SET v = 1")

	open := func() *sql.DB {
		_, db := gatetest.Open(t, fakedb.New(), bulkhead.Policy{MaxConcurrent: 1})
		return db
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, errs["canceled"] = open().ExecContext(ctx, "UPDATE t SET v = 1")
	ctx, cancel = context.WithDeadline(t.Context(), time.Unix(1, 0))
	defer cancel()
	_, errs["deadline"] = open().ExecContext(ctx, "UPDATE t SET v = 1")
	return errs
}

func TestStatusMapsEachKindOfErrorToItsCode(t *testing.T) {
	errs := dbErrors(t)
	for _, c := range []struct {
		name  string
		err   error
		code  int
		after time.Duration
	}{
		{"nil", nil, http.StatusOK, 0},
		{"queue timeout", errs["queue timeout"], http.StatusServiceUnavailable, time.Second},
		{"admission full", errs["admission full"], http.StatusServiceUnavailable, time.Second},
		{"wrapped rejection", fmt.Errorf("load order 7: %w", errs["admission full"]), http.StatusServiceUnavailable, time.Second},
		{"closed", errs["closed"], http.StatusServiceUnavailable, 0},
		{"deadline", errs["deadline"], http.StatusGatewayTimeout, 0},
		{"canceled", errs["canceled"], httpgate.StatusClientClosedRequest, 0},
		{"wrapped canceled", fmt.Errorf("load order 7: %w", errs["canceled"]), httpgate.StatusClientClosedRequest, 0},
		{"outcome unknown", fmt.Errorf("%w: COMMIT got no answer", bulkhead.ErrOutcomeUnknown), http.StatusInternalServerError, 0},
		{"outcome unknown past the caller's deadline", errors.Join(context.DeadlineExceeded, bulkhead.ErrOutcomeUnknown), http.StatusInternalServerError, 0},
		{"other", errors.New("pq: relation orders does not exist"), http.StatusInternalServerError, 0},
		{"bad conn", sql.ErrConnDone, http.StatusInternalServerError, 0},
		{"dial failed", fmt.Errorf("connect: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.EHOSTUNREACH}), http.StatusServiceUnavailable, time.Second},
		{"refused, without a dial error", errors.Join(errors.New("attempt 1"), os.NewSyscallError("connect", syscall.ECONNREFUSED)), http.StatusServiceUnavailable, time.Second},
		{"reset mid-query", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, http.StatusInternalServerError, 0},
		{"refused, past the caller's deadline", errors.Join(context.DeadlineExceeded, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), http.StatusGatewayTimeout, 0},
	} {
		code, after := httpgate.Status(c.err)
		if code != c.code || after != c.after {
			t.Errorf("%s: Status(%v) = %d, %v; want %d, %v", c.name, c.err, code, after, c.code, c.after)
		}
	}
}

func TestWriteErrorSendsRetryAfterWithARejectionOnly(t *testing.T) {
	errs := dbErrors(t)
	for _, c := range []struct {
		name, retryAfter, body string
		err                    error
		code                   int
	}{
		{"rejection", "1", "Service Unavailable\n", errs["admission full"], 503},
		{"closed", "", "Service Unavailable\n", errs["closed"], 503},
		{"deadline", "", "Gateway Timeout\n", errs["deadline"], 504},
		{"canceled", "", "Client Closed Request\n", errs["canceled"], 499},
		{"other", "", "Internal Server Error\n", errors.New("secret: relation orders_internal"), 500},
	} {
		w := httptest.NewRecorder()
		if got := httpgate.WriteError(w, c.err); got != c.code {
			t.Errorf("%s: WriteError returned %d, want %d", c.name, got, c.code)
		}
		if w.Code != c.code || w.Header().Get("Retry-After") != c.retryAfter || w.Body.String() != c.body {
			t.Errorf("%s: wrote %d, Retry-After %q, body %q; want %d, %q, %q",
				c.name, w.Code, w.Header().Get("Retry-After"), w.Body.String(), c.code, c.retryAfter, c.body)
		}
		if ct := w.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" {
			t.Errorf("%s: Content-Type %q, want text/plain", c.name, ct)
		}
	}
}

func TestWriteErrorWritesNothingForANilError(t *testing.T) {
	w := httptest.NewRecorder()
	if got := httpgate.WriteError(w, nil); got != 0 {
		t.Errorf("WriteError(nil) returned %d, want 0", got)
	}
	if w.Body.Len() != 0 || len(w.Header()) != 0 || w.Flushed {
		t.Errorf("WriteError(nil) wrote headers %v, body %q", w.Header(), w.Body.String())
	}
}

func TestResponderRoundsRetryAfterUpToWholeSecondsOrLeavesItOut(t *testing.T) {
	rejected := &bulkhead.RejectedError{Cause: bulkhead.ErrQueueTimeout, MaxConcurrent: 4, MaxQueue: 8}
	for _, c := range []struct {
		set  time.Duration
		want string
	}{
		{0, "1"},
		{time.Nanosecond, "1"},
		{time.Second, "1"},
		{1500 * time.Millisecond, "2"},
		{30 * time.Second, "30"},
		{-1, ""},
	} {
		w := httptest.NewRecorder()
		httpgate.Responder{RetryAfter: c.set}.WriteError(w, rejected)
		if got := w.Header().Get("Retry-After"); got != c.want || w.Code != 503 {
			t.Errorf("RetryAfter %v: wrote %d with Retry-After %q, want 503 with %q", c.set, w.Code, got, c.want)
		}
	}
}

func TestHandlerAnswersARejectedRequestWith503OverHTTP(t *testing.T) {
	db := busyDB(t)
	logged := make(chan int, 2)
	rs := httpgate.Responder{
		RetryAfter: 3 * time.Second,
		Log: func(r *http.Request, code int, err error) {
			if r == nil || r.URL.Path != "/orders" || !errors.Is(err, bulkhead.ErrRejected) {
				t.Errorf("Log got request %v, error %v", r, err)
			}
			logged <- code
		},
	}
	srv := httptest.NewServer(rs.Handler(func(w http.ResponseWriter, r *http.Request) error {
		if _, err := db.ExecContext(r.Context(), "UPDATE orders SET v = 1"); err != nil {
			return fmt.Errorf("update orders: %w", err)
		}
		_, err := io.WriteString(w, "ok")
		return err
	}))
	defer srv.Close()

	resp, err := srv.Client().Get(srv.URL + "/orders")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "3" || string(body) != "Service Unavailable\n" {
		t.Errorf("got %s, Retry-After %q, body %q; want 503, \"3\", the status text",
			resp.Status, resp.Header.Get("Retry-After"), body)
	}
	srv.Close() // waits for the handler to return
	if n := len(logged); n != 1 {
		t.Fatalf("Log called %d times, want 1", n)
	}
	if code := <-logged; code != 503 {
		t.Errorf("Log saw code %d, want 503", code)
	}
}

func TestHandlerFuncAnswersACancelledRequestWith499AndPassesSuccess(t *testing.T) {
	g, db := gatetest.Open(t, fakedb.New(), bulkhead.Policy{MaxConcurrent: 1})
	h := httpgate.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if _, err := db.ExecContext(r.Context(), "UPDATE orders SET v = 1"); err != nil {
			return err
		}
		_, err := io.WriteString(w, "ok")
		return err
	})

	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/orders", nil))
	if w.Code != 200 || w.Body.String() != "ok" {
		t.Errorf("success: got %d %q, want 200 \"ok\"", w.Code, w.Body.String())
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel() // the client went away before the handler reached the database
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequestWithContext(ctx, "POST", "/orders", nil))
	if w.Code != httpgate.StatusClientClosedRequest || w.Header().Get("Retry-After") != "" {
		t.Errorf("cancelled: got %d, Retry-After %q; want 499 and none", w.Code, w.Header().Get("Retry-After"))
	}
	if s := g.Stats(); s.Running != 0 || s.Admitted != 1 {
		t.Errorf("stats %+v, want nothing running, 1 admitted", s)
	}
}

// tcpConnector's Connect dials addr, as a network driver does first: when
// the server cannot be reached it fails with the dial's error.
type tcpConnector struct{ addr string }

func (c tcpConnector) Connect(ctx context.Context) (driver.Conn, error) {
	nc, err := new(net.Dialer).DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	nc.Close()
	return nil, fmt.Errorf("%s accepted a connection; the test wants it refused", c.addr)
}

func (c tcpConnector) Driver() driver.Driver { return nil }

// A database that refuses connections (a port on 127.0.0.1 whose listener
// was closed) is a dependency that is down: 503 with Retry-After, as for a
// rejection, not the 500 of a failing query.
func TestADatabaseThatRefusesConnectionsIsAnswered503WithRetryAfter(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	g, db := gatetest.Open(t, tcpConnector{addr}, bulkhead.Policy{MaxConcurrent: 1})
	var dbErr error
	h := httpgate.Responder{RetryAfter: 3 * time.Second}.Handler(func(w http.ResponseWriter, r *http.Request) error {
		_, dbErr = db.ExecContext(r.Context(), "UPDATE orders SET v = 1")
		return dbErr
	})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/orders", nil))
	if !errors.Is(dbErr, syscall.ECONNREFUSED) {
		t.Fatalf("Exec: %v, want connection refused", dbErr)
	}
	if w.Code != 503 || w.Header().Get("Retry-After") != "3" || w.Body.String() != "Service Unavailable\n" {
		t.Errorf("refused (%v): wrote %d, Retry-After %q, body %q; want 503, \"3\", the status text", dbErr, w.Code, w.Header().Get("Retry-After"), w.Body.String())
	}
	if s := g.Stats(); s.DialErrors != 1 || s.Running != 0 {
		t.Errorf("stats %+v, want 1 dial error, nothing running", s)
	}
}
