// Package httpgate turns the errors of a gated database call into HTTP
// responses: a rejection becomes 503 Service Unavailable with a
// Retry-After header, so that clients and load balancers back off instead
// of piling more work on a saturated database.
//
//	func (s *server) order(w http.ResponseWriter, r *http.Request) error {
//		row := s.db.QueryRowContext(r.Context(), "SELECT ...")
//		...
//		return err // nil, a rejection, a context error, anything
//	}
//
//	mux.Handle("GET /orders/{id}", httpgate.HandlerFunc(s.order))
//
// The mapping, by errors.Is on the error chain, first match wins:
//
//	nil                        200, nothing written
//	bulkhead.ErrRejected       503 Service Unavailable, Retry-After (1 s by default)
//	bulkhead.ErrClosed         503 Service Unavailable, no Retry-After (shutting down)
//	bulkhead.ErrOutcomeUnknown 500 Internal Server Error, no Retry-After (a COMMIT may have taken effect: not to be retried blindly)
//	context.DeadlineExceeded   504 Gateway Timeout
//	context.Canceled           499 Client Closed Request
//	the database unreachable   503 Service Unavailable, Retry-After (as a rejection)
//	anything else              500 Internal Server Error
//
// The database is unreachable when a connection to it could not be made:
// the chain holds a *net.OpError whose Op is "dial" (refused, no route,
// dial timeout) or matches syscall.ECONNREFUSED. A dependency that is
// down is a 503 to retry later; an error on a connection that was made
// (a failed query, a connection reset mid-statement) stays a 500.
//
// 504 for a deadline: the request's own time budget ran out while it
// waited on the database, the upstream of this server, which is what 504
// means; it is not the client's fault (408 would say it is) and retrying
// at once would meet the same slow database. 499 for a cancellation:
// database/sql returns context.Canceled when the request's context was
// cancelled, which net/http does when the client closes the connection.
// No standard code says "the client went away"; nginx's 499 says exactly
// that, is what log pipelines and dashboards already count apart from
// server errors, and is never seen by the client, who is gone. A
// cancellation that the server caused itself should be wrapped in another
// error by the handler if it must count as a 500.
//
// The response body is the status text only: the error's own text, which
// may name tables or hosts, is never sent to the client. Log it yourself
// (the handler has it) or use Responder.Log.
//
// The package uses only the standard library and bulkhead.
package httpgate

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// StatusClientClosedRequest is nginx's non-standard 499: the client closed
// the connection before the response was written.
const StatusClientClosedRequest = 499

// DefaultRetryAfter is the Retry-After that Status, WriteError and a zero
// Responder give a rejection or an unreachable database.
const DefaultRetryAfter = time.Second

// Status maps the error of a gated database call to an HTTP status code
// and, for a rejection or an unreachable database, the delay to send in
// Retry-After (0: no header).
// See the package documentation for the mapping. It is
// Responder{}.Status.
func Status(err error) (code int, retryAfter time.Duration) { return Responder{}.Status(err) }

// WriteError writes the response for err as Responder{}.WriteError does
// and returns the status code written; for a nil err it writes nothing and
// returns 0.
func WriteError(w http.ResponseWriter, err error) int { return Responder{}.WriteError(w, err) }

// Responder is a configured mapping from errors to responses. The zero
// value is ready to use, with DefaultRetryAfter. A Responder is safe for
// concurrent use; do not change its fields while it is in use.
type Responder struct {
	// RetryAfter is the delay sent in the Retry-After header of a
	// rejection or an unreachable database, rounded up to whole seconds
	// (the header's unit). Zero means DefaultRetryAfter; a negative value
	// sends no header.
	RetryAfter time.Duration
	// Log, if set, is called with every error WriteError answers, the
	// status code chosen and the request (nil when WriteError was called
	// directly), before the response is written.
	Log func(r *http.Request, code int, err error)
}

// Status is the package function Status with rs.RetryAfter.
func (rs Responder) Status(err error) (code int, retryAfter time.Duration) {
	switch {
	case err == nil:
		return http.StatusOK, 0
	case errors.Is(err, bulkhead.ErrRejected):
		return http.StatusServiceUnavailable, rs.retryAfter()
	case errors.Is(err, bulkhead.ErrClosed):
		return http.StatusServiceUnavailable, 0
	case errors.Is(err, bulkhead.ErrOutcomeUnknown):
		return http.StatusInternalServerError, 0
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, 0
	case errors.Is(err, context.Canceled):
		return StatusClientClosedRequest, 0
	case unreachable(err):
		return http.StatusServiceUnavailable, rs.retryAfter()
	}
	return http.StatusInternalServerError, 0
}

// unreachable reports whether err says that no connection could be made:
// a *net.OpError with Op "dial" anywhere in its tree, or ECONNREFUSED.
func unreachable(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	for err != nil {
		if oe, ok := err.(*net.OpError); ok && oe.Op == "dial" {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			return slices.ContainsFunc(u.Unwrap(), unreachable)
		default:
			return false
		}
	}
	return false
}

func (rs Responder) retryAfter() time.Duration {
	switch {
	case rs.RetryAfter == 0:
		return DefaultRetryAfter
	case rs.RetryAfter < 0:
		return 0
	}
	// Round up to whole seconds: Retry-After cannot say less than 1.
	return (rs.RetryAfter + time.Second - 1).Truncate(time.Second)
}

// WriteError writes the response for err: the status code from Status,
// a Retry-After header in whole seconds when Status gives a delay, and
// the status text as a plain-text body. It returns the code written. For
// a nil err it writes nothing and returns 0. Call it before anything else
// is written to w.
func (rs Responder) WriteError(w http.ResponseWriter, err error) int {
	return rs.write(w, nil, err)
}

func (rs Responder) write(w http.ResponseWriter, r *http.Request, err error) int {
	if err == nil {
		return 0
	}
	code, after := rs.Status(err)
	if rs.Log != nil {
		rs.Log(r, code, err)
	}
	if after > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(after/time.Second), 10))
	}
	text := http.StatusText(code)
	if code == StatusClientClosedRequest {
		text = "Client Closed Request"
	}
	http.Error(w, text, code)
	return code
}

// Handler returns an http.Handler that calls h and answers its error, if
// any, with WriteError. h must not have written to w when it returns an
// error.
func (rs Responder) Handler(h HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			rs.write(w, r, err)
		}
	})
}

// HandlerFunc is an HTTP handler that returns its error instead of
// writing it. Its ServeHTTP answers the error with the zero Responder.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// ServeHTTP calls f and answers its error, if any, as
// Responder{}.Handler(f) does.
func (f HandlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := f(w, r); err != nil {
		Responder{}.write(w, r, err)
	}
}
