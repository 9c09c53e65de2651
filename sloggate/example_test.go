//go:build go1.25

package sloggate_test

import (
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/sloggate"
)

// Events logs the gate's decisions; this logger drops the time and
// the durations so that the output is stable.
func Example() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Value.Kind() == slog.KindDuration {
				return slog.Attr{}
			}
			return a
		},
	}))
	g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1},
		bulkhead.WithEvents(sloggate.Events(logger)))
	if err != nil {
		log.Fatal(err)
	}
	db := g.OpenDB()
	defer db.Close()

	tx, _ := db.Begin()
	_, err = db.Exec("UPDATE stock SET qty = 0") // B=1, Q=0: rejected while tx runs
	fmt.Println(errors.Is(err, bulkhead.ErrRejected))
	tx.Commit()
	// Output:
	// level=DEBUG msg="bulkhead: admitted" kind=transaction
	// level=WARN msg="bulkhead: rejected" kind=statement reason=admission_full
	// true
	// level=DEBUG msg="bulkhead: released" kind=transaction
}
