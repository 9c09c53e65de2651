package pgxgate_test

import (
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/httpgate"
	"github.com/dbbulkhead/bulkhead/pgxgate"
)

// The README's quick start: the policy from the BULKHEAD_* variables, pgx
// behind the gate with pgxgate's settings, and HTTP handlers that answer a
// rejection with 503 and Retry-After. The README adds Prometheus metrics
// from the promgate module at the two places marked below; this module
// does not require promgate, so that a user of pgxgate downloads nothing
// of Prometheus.
func Example() {
	policy, err := bulkhead.PolicyFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	// metrics := promgate.New(promgate.Opts{}), then add
	// bulkhead.WithEvents(metrics.Events()) to OpenDB's options.
	db, gate, err := pgxgate.OpenDB(os.Getenv("DATABASE_URL"), policy)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close() // one *sql.DB for the whole service: GORM and sqlc code use it too
	// metrics.Attach(gate); prometheus.MustRegister(metrics)
	log.Printf("gate: at most %d operations at once, %d waiting", gate.Stats().MaxConcurrent, gate.Stats().MaxQueue)

	rs := httpgate.Responder{RetryAfter: time.Second}
	http.Handle("GET /answer", rs.Handler(func(w http.ResponseWriter, r *http.Request) error {
		var n int
		if err := db.QueryRowContext(r.Context(), "SELECT 42").Scan(&n); err != nil {
			return err // under overload errors.Is(err, bulkhead.ErrRejected): 503 with Retry-After
		}
		_, err := fmt.Fprintln(w, n)
		return err
	}))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
