package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// Limits shared by the measuring commands.
const (
	MaxClients    = 10_000 // clients, workers, B and Q of a measuring command
	MaxErrSamples = 10     // distinct error messages kept
)

// Outcome is how an operation ended. Every attempted operation ends in
// exactly one.
type Outcome int

const (
	OutCompleted Outcome = iota
	OutRejectedFull
	OutRejectedTimeout
	OutRejectedDeadline // refused by the gate: it would have missed its deadline
	OutDeadline
	OutInterrupted
	OutOther
	NumOutcomes
)

// Classify decides an operation's outcome from its error and contexts.
func Classify(err error, opCtx, runCtx context.Context) Outcome {
	switch {
	case err == nil:
		return OutCompleted
	case errors.Is(err, bulkhead.ErrAdmissionFull):
		return OutRejectedFull
	case errors.Is(err, bulkhead.ErrQueueTimeout):
		return OutRejectedTimeout
	case errors.Is(err, bulkhead.ErrWouldMissDeadline):
		return OutRejectedDeadline
	case runCtx.Err() != nil:
		return OutInterrupted
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(opCtx.Err(), context.DeadlineExceeded):
		return OutDeadline
	}
	return OutOther
}

// AddErrSample counts err in samples by its message (one line, at most
// 200 characters), keeping at most MaxErrSamples messages.
func AddErrSample(samples map[string]int, err error) {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	if _, ok := samples[msg]; ok || len(samples) < MaxErrSamples {
		samples[msg]++
	}
}

// Pct are percentiles, in milliseconds.
type Pct struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

// Ms is d in milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Percentiles returns p50, p95 and p99 (nearest rank) of ds in
// milliseconds, or nil when ds is empty.
func Percentiles(ds []time.Duration) *Pct {
	if len(ds) == 0 {
		return nil
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return Ms(s[min(max(i, 0), len(s)-1)])
	}
	return &Pct{P50: at(0.50), P95: at(0.95), P99: at(0.99)}
}

// PolicyJSON is a gate's policy in the JSON of the measuring commands.
type PolicyJSON struct {
	MaxConcurrent int     `json:"max_concurrent"`
	MaxQueue      int     `json:"max_queue"`
	QueueWaitMs   float64 `json:"queue_wait_ms"`
	DryRun        bool    `json:"dry_run,omitempty"`
	Adaptive      bool    `json:"adaptive,omitempty"`       // MaxConcurrent is the ceiling of the B in force
	MinConcurrent int     `json:"min_concurrent,omitempty"` // adaptive: the floor of the B in force
}

// Operation returns what one operation of a measuring command does on t:
// a transaction that holds the database for hold (work "hold": pg_sleep
// on PostgreSQL, SLEEP on MySQL, an open transaction on SQLite) or runs
// one CPU-bound query over cpuRows rows (work "cpu").
func Operation(t *Target, work string, hold time.Duration, cpuRows int) func(ctx context.Context, db *sql.DB) error {
	d := t.Dialect
	var body func(ctx context.Context, tx *sql.Tx) error
	switch {
	case work == "cpu" && d == DialectPostgres:
		body = scanOne(fmt.Sprintf("SELECT sum(i) FROM generate_series(1, %d) i", cpuRows))
	case work == "cpu" && d == DialectMySQL:
		body = scanOne(fmt.Sprintf("SELECT BENCHMARK(%d, MD5('bulkhead'))", 3*cpuRows))
	case work == "cpu":
		body = scanOne(fmt.Sprintf("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < %d) SELECT sum(i) FROM s", cpuRows))
	case d == DialectPostgres:
		body = func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "SELECT pg_sleep($1)", hold.Seconds())
			return err
		}
	case d == DialectMySQL:
		body = scanOne("SELECT SLEEP(?)", hold.Seconds())
	default:
		// SQLite: a transaction that has run a statement, held open.
		one := scanOne("SELECT 1")
		body = func(ctx context.Context, tx *sql.Tx) error {
			if err := one(ctx, tx); err != nil {
				return err
			}
			return Sleep(ctx, hold)
		}
	}
	return func(ctx context.Context, db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := body(ctx, tx); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	}
}

func scanOne(query string, args ...any) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		var v sql.NullInt64
		return tx.QueryRowContext(ctx, query, args...).Scan(&v)
	}
}

// Sleep waits d, or until ctx ends: then it returns ctx.Err().
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
