package main

import (
	"context"
	"fmt"
	"time"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/internal/demo"
)

const demoUsage = `Usage: bulkhead demo [--dsn URL]

The demonstration: a pool of 2 connections behind a gate with B=1, Q=0.
A first transaction takes the only execution permit and holds it; a second
operation is rejected at once (errors.Is(err, bulkhead.ErrRejected)); the
first transaction then runs SELECT 42 and commits, and the gate has its
permit back. It prints exactly:

  overload=rejected
  query=42
  available=1

Without --dsn or DATABASE_URL it runs on an embedded in-memory SQLite
database (github.com/ncruces/go-sqlite3: SQLite compiled to WebAssembly,
run by wazero; no cgo, no C compiler needed); postgres:// runs it through
pgx, mysql:// through go-sql-driver/mysql. The policy flags and BULKHEAD_*
variables do not apply: the demonstration's policy is fixed.
`

const demoExamples = `  bulkhead demo
  bulkhead demo --dsn postgres://postgres@127.0.0.1:5432/test?sslmode=disable
  bulkhead demo --dsn mysql://root@127.0.0.1:3306/test
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/test bulkhead demo
`

// demoTimeout bounds the demonstration once connected; the first
// connection has the target's startTimeout on top (the embedded SQLite
// compiles its engine then: seconds, many more on a busy machine).
const demoTimeout = 30 * time.Second

func (e *env) demo(ctx context.Context, args []string) int {
	fs := e.NewFlagSet("demo", demoUsage, demoExamples)
	dsn := fs.String("dsn", "", "database URL: postgres://... or mysql://...")
	pi := e.AddPolicyFlags(fs)
	set, code, done := pi.Parse(args)
	if done {
		return code
	}
	t, err := e.ResolveTarget(*dsn, set["dsn"])
	if err != nil {
		return e.Fail(fmt.Errorf("demo: %w", err))
	}
	runCtx, cancel := context.WithTimeout(ctx, t.StartTimeout()+demoTimeout)
	defer cancel()
	lines, err := runDemo(runCtx, t)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(e.Stderr, "bulkhead: demo: interrupted")
			return cli.ExitInterrupted
		}
		return e.Fail(fmt.Errorf("demo on %s: %w", t.Display, err))
	}
	for _, l := range lines {
		fmt.Fprintln(e.Stdout, l)
	}
	return cli.ExitOK
}

// runDemo runs the demonstration on t and returns the three lines.
func runDemo(ctx context.Context, t *cli.Target) ([]string, error) {
	inner, err := t.Connector("bulkhead-demo", true)
	if err != nil {
		return nil, err
	}
	return demo.Run(ctx, inner)
}
