package outside // tests/outside/run sets the suite's package here

// The one place where the rewritten suites reach the driver's own
// connection: tests/outside/rewrite starts every (*sql.Conn).Raw callback
// of a suite with "dc = gateUnwrap(dc);", so that the suite's own type
// assertions (dc.(*stdlib.Conn), dc.(*mysqlConn), dc.(driver.Execer))
// see what they see without the gate. Used by every rewritten arm,
// passthru included (there bulkhead.Unwrap returns dc as it is).

import "github.com/dbbulkhead/bulkhead"

// gateUnwrap returns bulkhead.Unwrap(dc). It compiles with either
// signature of bulkhead.Unwrap, func(any) any and func(any) (any, error):
// gateUnwrapped takes the second result, if any, through its variadic
// parameter. An error panics with its message, inside Raw, where the
// suite's failed type assertion would have panicked.
func gateUnwrap(dc any) any { return gateUnwrapped(bulkhead.Unwrap(dc)) }

func gateUnwrapped(c any, errs ...any) any {
	for _, e := range errs {
		if e != nil {
			panic("tests/outside: bulkhead.Unwrap: " + e.(error).Error())
		}
	}
	return c
}
