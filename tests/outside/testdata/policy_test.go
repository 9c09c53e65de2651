package outside // tests/outside/run sets the suite's package here

// The policy of every gated arm (gate, pgxgate), in one place. Generous:
// the gate must never reject, so that a difference from plain is one of
// behaviour, not of budget. The widest burst of the suites is pgx's
// TestConnConcurrency, 50 goroutines on one *sql.DB: B+Q must be at least
// 50 (with B=16, Q=16 the gate rejects 18 of them at once). Only an
// operation that holds an execution permit gets a server connection, so
// the server sees at most about B connections per gate.

import (
	"time"

	"github.com/dbbulkhead/bulkhead"
)

var gatePolicy = bulkhead.Policy{MaxConcurrent: 16, MaxQueue: 48, QueueWait: 5 * time.Second}
