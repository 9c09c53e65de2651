// Command demo is the first command of the README: the article's
// demonstration on an embedded in-memory SQLite database, built from the
// gate and the SQLite engine alone (no pgx, no MySQL driver) so that it
// builds fast on a fresh machine:
//
//	go run ./cmd/bulkhead/demo
//
// prints
//
//	overload=rejected
//	query=42
//	available=1
//
// The same demonstration on a server is `go run ./cmd/bulkhead demo --dsn
// URL`. Exit status: 0 ok, 2 an error (any argument is one).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/internal/demo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "bulkhead demo: takes no arguments, got %q; for a server: go run ./cmd/bulkhead demo --dsn postgres://... (or mysql://...)\n", args)
		return 2
	}
	// Its first connection compiles the WebAssembly engine: seconds, more
	// on a busy machine.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	inner, err := demo.SQLite()
	if err == nil {
		var lines []string
		if lines, err = demo.Run(ctx, inner); err == nil {
			for _, l := range lines {
				fmt.Fprintln(stdout, l)
			}
			return 0
		}
	}
	fmt.Fprintf(stderr, "bulkhead demo: embedded SQLite: %v\n", err)
	return 2
}
