//go:build go1.25

package httpgate_test

import (
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/httpgate"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

// The README's HTTP snippet: a handler that returns its error; a
// rejection becomes 503 with Retry-After.
func Example() {
	var db *sql.DB // the gated *sql.DB: bulkhead.New(...).OpenDB()

	mux := http.NewServeMux()
	rs := httpgate.Responder{
		RetryAfter: 2 * time.Second,
		Log: func(r *http.Request, code int, err error) {
			log.Printf("%s %s: %d: %v", r.Method, r.URL.Path, code, err)
		},
	}
	mux.Handle("POST /orders", rs.Handler(func(w http.ResponseWriter, r *http.Request) error {
		_, err := db.ExecContext(r.Context(), "INSERT INTO orders (item) VALUES ($1)", r.FormValue("item"))
		if err != nil {
			return fmt.Errorf("insert order: %w", err) // 503, 504, 499 or 500
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

// A request that meets a full gate.
func ExampleHandlerFunc() {
	g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1})
	if err != nil {
		log.Fatal(err)
	}
	db := g.OpenDB()
	defer db.Close()
	h := httpgate.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, err := db.ExecContext(r.Context(), "UPDATE stock SET qty = qty - 1")
		return err
	})

	tx, _ := db.Begin() // holds the one permit
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/buy", nil))
	tx.Rollback()
	fmt.Println(w.Code, w.Header().Get("Retry-After"), w.Body.String())
	// Output:
	// 503 1 Service Unavailable
}

func ExampleStatus() {
	code, retryAfter := httpgate.Status(&bulkhead.RejectedError{Cause: bulkhead.ErrAdmissionFull})
	fmt.Println(code, retryAfter)
	// Output:
	// 503 1s
}
