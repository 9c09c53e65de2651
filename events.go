package bulkhead

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"time"
)

// Kind says what a gated operation is.
type Kind uint8

const (
	KindTx    Kind = iota + 1 // a transaction, from BeginTx until the driver's Commit or Rollback returned
	KindExec                  // an autocommit statement (Exec, or a prepared statement's Exec)
	KindQuery                 // an autocommit query, until its rows are closed
)

func (k Kind) String() string {
	switch k {
	case KindTx:
		return "transaction"
	case KindExec:
		return "statement"
	case KindQuery:
		return "query"
	}
	return "unknown"
}

// Event describes one step of a gated operation.
type Event struct {
	Kind     Kind
	Workload string        // the workload budget it passed, "" for none
	Reason   error         // OnReject: ErrAdmissionFull or ErrQueueTimeout
	DryRun   bool          // OnReject: the rejection was not made (Policy.DryRun)
	Waited   time.Duration // time spent waiting for the execution permits
	Held     time.Duration // OnRelease and hold warnings: time the permits were held
}

// Events are callbacks on the gate's decisions, each called synchronously
// on the goroutine of the operation (OnRelease: on the goroutine that ended
// it, possibly database/sql's own): they must be fast, must not block and
// must not call the gate. Nil callbacks are skipped. A panic in one is
// logged and recovered.
type Events struct {
	OnAdmit   func(Event) // the permits and a server connection acquired
	OnReject  func(Event) // rejected (or, with DryRun set, would have been); not called for cancellations
	OnRelease func(Event) // the permits about to be given back (an admission they make possible comes after)
}

// emit calls an event callback, recovering a panic in it: it would
// otherwise escape between taking permits and registering their release.
func emit(f func(Event), e Event) {
	defer func() {
		if v := recover(); v != nil {
			slog.Default().Error("bulkhead: event callback panicked", "kind", e.Kind.String(), "panic", v, "stack", string(debug.Stack()))
		}
	}()
	f(e)
}

// JoinEvents returns Events that call, for each callback, those of es in
// order; a callback no element sets stays nil.
func JoinEvents(es ...Events) Events {
	var admit, reject, release []func(Event)
	for _, e := range es {
		if e.OnAdmit != nil {
			admit = append(admit, e.OnAdmit)
		}
		if e.OnReject != nil {
			reject = append(reject, e.OnReject)
		}
		if e.OnRelease != nil {
			release = append(release, e.OnRelease)
		}
	}
	return Events{OnAdmit: fanOut(admit), OnReject: fanOut(reject), OnRelease: fanOut(release)}
}

func fanOut(fs []func(Event)) func(Event) {
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	return func(e Event) {
		for _, f := range fs {
			f(e)
		}
	}
}

// ReasonLabel names the cause of a rejection for logs and metric labels:
// "admission_full" or "queue_timeout" (errors.Is, so that a rejection or
// an Event.Reason both work); "" for anything else.
func ReasonLabel(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrAdmissionFull):
		return "admission_full"
	case errors.Is(err, ErrQueueTimeout):
		return "queue_timeout"
	}
	return ""
}

// SlogEvents returns Events that log through logger (slog.Default() when
// nil): admissions and releases at Debug, "bulkhead: admitted" and
// "bulkhead: released" with kind, workload (when named), waited and held;
// rejections at Warn, "bulkhead: rejected" (or "bulkhead: would reject
// (dry run)"), without a record per rejection: the first is logged at once
// with kind, workload, reason and waited; those that follow within a
// second are counted, and logged as one record per (reason, workload, dry
// run) each second while they go on, with count (rejections since the
// previous record) and over (the time that covers). After a second
// without rejections, the next one is logged at once again. Counting a
// rejection takes a mutex and allocates nothing; a process that exits
// within a second of its last rejections does not log their summary.
func SlogEvents(logger *slog.Logger) Events { return slogEvents(logger, time.Second) }

func slogEvents(logger *slog.Logger, every time.Duration) Events {
	get := func() *slog.Logger {
		if logger != nil {
			return logger
		}
		return slog.Default()
	}
	ctx := context.Background()
	log := func(level slog.Level, msg string, e Event, attrs ...slog.Attr) {
		lg := get()
		if !lg.Enabled(ctx, level) {
			return
		}
		all := append(make([]slog.Attr, 0, 5), slog.String("kind", e.Kind.String()))
		if e.Workload != "" {
			all = append(all, slog.String("workload", e.Workload))
		}
		lg.LogAttrs(ctx, level, msg, append(all, attrs...)...)
	}
	s := &summary{logger: get, every: every}
	return Events{
		OnAdmit: func(e Event) { log(slog.LevelDebug, "bulkhead: admitted", e, slog.Duration("waited", e.Waited)) },
		OnRelease: func(e Event) {
			log(slog.LevelDebug, "bulkhead: released", e, slog.Duration("waited", e.Waited), slog.Duration("held", e.Held))
		},
		OnReject: func(e Event) {
			if !get().Enabled(ctx, slog.LevelWarn) {
				return
			}
			if s.every <= 0 || s.count(e) {
				log(slog.LevelWarn, rejectMessage(e.DryRun), e, slog.String("reason", ReasonLabel(e.Reason)), slog.Duration("waited", e.Waited))
				if s.every > 0 {
					time.AfterFunc(s.every, s.flush) // after the record, so that no summary comes before it
				}
			}
		},
	}
}

func rejectMessage(dryRun bool) string {
	if dryRun {
		return "bulkhead: would reject (dry run)"
	}
	return "bulkhead: rejected"
}

// group is what a summary record counts: rejections of one reason and
// workload, made or not (dry run).
type group struct {
	reason   string
	workload string
	dryRun   bool
}

// summary counts rejections between records. A window opens with a
// rejection logged at once and a timer; each time the timer fires, the
// counts are logged and the timer armed again, or, with none, the window
// closes.
type summary struct {
	logger func() *slog.Logger
	every  time.Duration

	mu     sync.Mutex
	open   bool
	start  time.Time
	counts map[group]int64 // kept at 0 while the window is open, so that counting does not allocate
}

// count counts a rejection, and reports whether it is to be logged at
// once: when it opens a window.
func (s *summary) count(e Event) (now bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.open {
		s.open, s.start = true, time.Now()
		return true
	}
	if s.counts == nil {
		s.counts = map[group]int64{}
	}
	s.counts[group{ReasonLabel(e.Reason), e.Workload, e.DryRun}]++
	return false
}

func (s *summary) flush() {
	type line struct {
		group
		n int64
	}
	var out []line
	s.mu.Lock()
	for g, n := range s.counts {
		if n > 0 {
			out = append(out, line{g, n})
			s.counts[g] = 0
		}
	}
	now := time.Now()
	over := now.Sub(s.start)
	s.start = now
	if len(out) == 0 {
		s.open = false
		clear(s.counts)
	} else {
		time.AfterFunc(s.every, s.flush)
	}
	s.mu.Unlock()

	ctx := context.Background()
	lg := s.logger()
	if len(out) == 0 || !lg.Enabled(ctx, slog.LevelWarn) {
		return
	}
	slices.SortFunc(out, func(a, b line) int {
		if a.dryRun != b.dryRun {
			if a.dryRun {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.reason, b.reason), cmp.Compare(a.workload, b.workload))
	})
	for _, l := range out {
		attrs := make([]slog.Attr, 0, 4)
		if l.workload != "" {
			attrs = append(attrs, slog.String("workload", l.workload))
		}
		attrs = append(attrs, slog.String("reason", l.reason), slog.Int64("count", l.n), slog.Duration("over", over))
		lg.LogAttrs(ctx, slog.LevelWarn, rejectMessage(l.dryRun), attrs...)
	}
}
