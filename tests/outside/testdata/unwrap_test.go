package outside // tests/outside/run sets the suite's package here

// The one place where the rewritten suites reach the driver's own
// connection: tests/outside/rewrite turns each (*sql.Conn).Raw callback's
// assertion of its connection to a concrete type (dc.(*stdlib.Conn),
// dc.(*mysqlConn)) into gateUnwrap(dc).(...), as a user of the gate would
// write it; assertions to an interface (dc.(driver.Execer)) are left to
// what Raw hands over. Used by every rewritten arm, passthru included
// (there bulkhead.Unwrap returns dc as it is).

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
