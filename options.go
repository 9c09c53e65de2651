package bulkhead

import (
	"database/sql/driver"
	"log/slog"
	"time"
)

// Option configures a Gate beyond its Policy.
type Option func(*options)

type options struct {
	events      Events
	holdLimit   time.Duration
	onHold      func(Event)
	reserve     time.Duration
	pgDL        *PostgresDeadline
	maxLifetime time.Duration
	maxIdleTime time.Duration
	dialTimeout time.Duration
	connWait    time.Duration

	fleetInterval time.Duration
	fleetFallback *int
	fleetConn     driver.Connector
	fleetStore    func() fleetStore // the package's tests: an in-memory coordination
	fleetID       int64             // the package's tests: the process's id in the fleet
	fleetLending  bool
	fleetNoTags   bool // WithFleetTagging(false)

	err error // the first invalid option: New returns it
}

// defaultDialTimeout bounds a dial that goes on after the operation that
// asked for it gave up (see WithDialTimeout).
const defaultDialTimeout = 30 * time.Second

// defaultConnWait is WithConnWait's default.
const defaultConnWait = time.Second

func (o *options) invalid(format string, args ...any) {
	if o.err == nil {
		o.err = invalid(format, args...)
	}
}

// WithEvents sets callbacks on admit, reject and release. Default: none.
// With OnRelease set, each operation also reads the clock when it starts.
func WithEvents(e Events) Option { return func(o *options) { o.events = e } }

// WithHoldWarning reports every operation that holds its permits longer
// than limit (a transaction left open, Rows never closed), like HikariCP's
// leak detection threshold: report is called once, limit after the permits
// were granted, with Kind, Waited and Held (= limit), on a timer goroutine
// (time.AfterFunc), while the operation still runs. A nil report logs a
// warning through slog.Default. A limit ≤ 0 turns the warning off (the
// default).
func WithHoldWarning(limit time.Duration, report func(Event)) Option {
	return func(o *options) {
		o.holdLimit = limit
		o.onHold = report
		if report == nil {
			o.onHold = logHold
		}
	}
}

// WithDeadlineReserve makes the wait for an execution permit end no later
// than the caller's deadline minus reserve: work that could not finish in
// time is rejected with ErrQueueTimeout (RejectedError.Deadline set)
// instead of being started. reserve is the time the work needs once
// started; 0 (the default) lets the wait run to the deadline itself, which
// then ends it with context.DeadlineExceeded.
// The reserve must be from 0 to MaxQueueWait: New reports any other value
// as an error matching ErrInvalidPolicy.
func WithDeadlineReserve(reserve time.Duration) Option {
	return func(o *options) {
		if reserve < 0 || reserve > MaxQueueWait {
			o.invalid("WithDeadlineReserve(%v), want 0s to %v", reserve, MaxQueueWait)
			return
		}
		o.reserve = reserve
	}
}

// PostgresDeadline configures WithPostgresDeadline.
type PostgresDeadline struct {
	// Reserve is subtracted from the time left before the caller's deadline
	// (the time the caller needs after the database answered).
	Reserve time.Duration
	// LockTimeout also sets lock_timeout to the same value.
	LockTimeout bool
}

// WithPostgresDeadline makes each gated transaction whose context has a
// deadline start with
//
//	SET LOCAL statement_timeout = <ms left before the deadline, minus Reserve>
//
// (and lock_timeout with LockTimeout), so that PostgreSQL itself stops work
// nobody will wait for (SQLSTATE 57014), even when the client's cancel
// request is late or lost. It costs one round trip per transaction with a
// deadline, sent on the transaction before BeginTx returns. PostgreSQL
// only; autocommit statements are not affected. The timeout is at least
// 1ms: a transaction started with less time left fails at its first
// statement. A deadline farther than PostgreSQL's largest timeout
// (2147483647 ms, about 24.8 days) sets that largest timeout. Reserve must
// be from 0 to MaxQueueWait: New reports any other value as an error
// matching ErrInvalidPolicy.
func WithPostgresDeadline(d PostgresDeadline) Option {
	return func(o *options) {
		if d.Reserve < 0 || d.Reserve > MaxQueueWait {
			o.invalid("WithPostgresDeadline: Reserve is %v, want 0s to %v", d.Reserve, MaxQueueWait)
			return
		}
		o.pgDL = &d
	}
}

// WithConnMaxLifetime closes a server connection once it is older than d,
// when it is next given back or looked for idle, as
// sql.DB.SetConnMaxLifetime does for database/sql's own pool (which, in
// front of a gate, holds only logical connections: see Gate.OpenDB). d ≤ 0
// (the default) keeps connections regardless of age.
func WithConnMaxLifetime(d time.Duration) Option {
	return func(o *options) { o.maxLifetime = max(d, 0) }
}

// WithConnMaxIdleTime closes a server connection that stayed idle longer
// than d, when the gate next looks for an idle one, as
// sql.DB.SetConnMaxIdleTime does for database/sql's own pool. d ≤ 0 (the
// default) keeps idle connections until MaxConns is lowered or the gate
// closes. The gate starts no goroutine to close them: with no traffic at
// all, idle connections stay open.
func WithConnMaxIdleTime(d time.Duration) Option {
	return func(o *options) { o.maxIdleTime = max(d, 0) }
}

// WithConnWait sets how long an operation that holds its permits waits
// for a server connection when all MaxConns are in use (default 1s), also
// the longest a Ping, a Prepare or Raw waits for one; then it gets
// ErrNoConnection. All MaxConns are in use only when sessions held outside
// operations (a *sql.Conn, a Ping, a Prepare, Raw) take some: an
// operation's own connection comes back to the gate as soon as
// database/sql takes it back, a moment after the operation's permits, and
// this wait covers that moment even on a busy machine, so that it costs
// nothing but a brief wait; a *sql.Conn holds its connection until it is
// closed. d must be above 0: New reports any other value as an error
// matching ErrInvalidPolicy.
func WithConnWait(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 || d > MaxQueueWait {
			o.invalid("WithConnWait(%v), want above 0s, at most %v", d, MaxQueueWait)
			return
		}
		o.connWait = d
	}
}

// WithDialTimeout bounds each dial of a server connection (default 30s).
// A dial runs on its own goroutine, so that an operation whose context
// ends while it dials returns at once, while the dial goes on and its
// connection is kept for the next operation instead of being thrown away;
// d bounds how long such a dial may go on, on top of the driver's own
// connect timeout. d must be above 0: New reports any other value as an
// error matching ErrInvalidPolicy.
func WithDialTimeout(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.invalid("WithDialTimeout(%v), want above 0s", d)
			return
		}
		o.dialTimeout = d
	}
}

func logHold(e Event) {
	slog.Default().Warn("bulkhead: operation holds its permits longer than the hold warning",
		"kind", e.Kind.String(), "workload", e.Workload, "held", e.Held, "waited", e.Waited)
}

// WithFleetInterval sets how often a gate in a fleet (Policy.Fleet) reads
// the fleet and adjusts its share: one statement on its coordination
// session per interval, plus one to lock or unlock slots when its share
// changes. A share settles within two intervals of a process starting or
// stopping. Default DefaultFleetInterval (1 s); at least 10ms.
func WithFleetInterval(d time.Duration) Option {
	return func(o *options) {
		if d < 10*time.Millisecond {
			o.invalid("WithFleetInterval(%v), want at least 10ms", d)
		}
		o.fleetInterval = d
	}
}

// WithFleetFallback sets the share of B a gate in a fleet keeps while its
// coordination fails, when it is less than the share it had (a failure
// never raises a share): DefaultFleetFallback (1) by default, so that the
// service keeps a trickle of work through a coordination outage; 0 keeps
// the fleet within T even then, at the price of rejecting everything until
// the coordination is back. See README "Fleets".
func WithFleetFallback(b int) Option {
	return func(o *options) {
		if b < 0 {
			o.invalid("WithFleetFallback(%d), want at least 0", b)
		}
		o.fleetFallback = &b
	}
}

// WithFleetConnector sets where a gate in a fleet opens its coordination
// session (one per process), by default its inner connector. The session
// holds PostgreSQL session-level advisory locks, so it must reach
// PostgreSQL itself, not through a pooler in transaction mode such as
// PgBouncer's: point it at the server when the operations go through one.
func WithFleetConnector(c driver.Connector) Option {
	return func(o *options) {
		if c == nil {
			o.invalid("WithFleetConnector(nil), want a connector")
		}
		o.fleetConn = c
	}
}

// WithFleetLending makes a gate in a fleet lend: an instance that ran
// nothing since its last round keeps one slot of its fair share and lends
// the rest to the instances that had operations waiting or rejected, still
// within T. The price is the way back: an idle instance that gets busy
// again runs on its one slot until the borrowers give its share back, two
// to three intervals later. Every instance of a fleet should set the same.
func WithFleetLending(on bool) Option { return func(o *options) { o.fleetLending = on } }

// WithFleetTagging sets whether a gate in a fleet tags each server
// connection with its process's id in the fleet (one statement per
// connection, run before its first operation within that operation's
// permits: a shared advisory lock the connection holds as long as it
// lives), on by default. The tags let the others see the statements a
// killed process left running on the server, and leave room for them
// until they end; untagged, those run beside the slots the others take.
// Turn it off only when the operations go through a pooler in transaction
// mode (PgBouncer's), where a session-level lock would stay on the
// pooler's server connection, shared by other clients. See README
// "Fleets".
func WithFleetTagging(on bool) Option { return func(o *options) { o.fleetNoTags = !on } }
