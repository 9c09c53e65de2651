package bulkhead

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// DefaultSlogInterval is the interval over which SlogEvents sums up
// rejections after logging the first one.
const DefaultSlogInterval = time.Second

// SlogEvents returns Events that log the gate's decisions through logger:
// admissions and releases at slog.LevelDebug, rejections at
// slog.LevelWarn, summed up over DefaultSlogInterval (1 s) so that an
// overload does not flood the log; it is SlogEventsEvery(logger,
// DefaultSlogInterval). Pass the result to WithEvents, alone or joined
// with other Events by JoinEvents:
//
//	g, err := bulkhead.New(inner, policy, bulkhead.WithEvents(bulkhead.SlogEvents(logger)))
func SlogEvents(logger *slog.Logger) Events {
	return SlogEventsEvery(logger, DefaultSlogInterval)
}

// SlogEventsEvery returns Events that log the gate's decisions through
// logger, summing up rejections over interval. A nil logger means
// slog.Default(), looked up at each record.
//
// Admissions and releases are logged one record each at
// slog.LevelDebug: "bulkhead: admitted" and "bulkhead: released", with
// the attributes kind ("transaction", "statement" or "query"), workload
// (only when the operation names one), waited, and held (on release).
//
// Rejections are logged at slog.LevelWarn, with the message "bulkhead:
// rejected", or, under Policy.DryRun, "bulkhead: would reject (dry run)"
// for a rejection counted but not made. The first rejection is logged at
// once, in a record of its own with kind, workload, reason
// ("admission_full", "queue_timeout" or "no_connection", see ReasonLabel)
// and waited. The rejections that follow within interval are counted,
// not logged: when interval has passed, one summary record is logged for
// each (reason, workload, dry run) that had rejections, with the same
// message and the attributes workload (when named), reason, count (the
// rejections since the previous record; an immediate record stands for
// one) and over (the time the count covers: interval, or more when the
// timer ran late, as in a process that was stopped). Summaries come
// every interval while rejections go on; once an interval passes with
// none, the next rejection is again logged at once. So a rejection is
// logged within interval, and an overload of any rate logs, per
// interval, at most one record for each (reason, workload, dry run)
// group, plus one when it starts.
//
// An interval ≤ 0 logs each rejection at once, in a record of its own:
// one line per rejection, as SlogEvents did before it summed them up.
//
// Summaries are logged from a timer (time.AfterFunc): no goroutine is
// started, nor left running, but for the one that logs a summary, and
// nothing needs closing; the timer stops, after one quiet interval, when
// rejections stop. A program that exits within interval of its last
// rejections does not log their summary: Gate.Stats or promgate count
// every rejection.
//
// The Events are safe for concurrent use, and may be shared by several
// gates (their rejections are then summed up together). Records are
// built only when the logger is enabled at their level: a logger above
// Debug costs one Enabled call per admission and release, one above Warn
// one per rejection, which is then neither logged nor counted. A
// rejection that is counted takes a mutex and does not allocate. The
// events carry no context: records are logged with context.Background().
func SlogEventsEvery(logger *slog.Logger, interval time.Duration) Events {
	l := func() *slog.Logger {
		if logger != nil {
			return logger
		}
		return slog.Default()
	}
	ctx := context.Background()
	log := func(lg *slog.Logger, level slog.Level, msg string, e Event, attrs ...slog.Attr) {
		all := make([]slog.Attr, 0, 5)
		all = append(all, slog.String("kind", e.Kind.String()))
		if e.Workload != "" {
			all = append(all, slog.String("workload", e.Workload))
		}
		all = append(all, attrs...)
		lg.LogAttrs(ctx, level, msg, all...)
	}
	logRejection := func(lg *slog.Logger, e Event) {
		log(lg, slog.LevelWarn, rejectMessage(e.DryRun), e, slog.String("reason", ReasonLabel(e.Reason)), slog.Duration("waited", e.Waited))
	}
	onReject := func(e Event) {
		if lg := l(); lg.Enabled(ctx, slog.LevelWarn) {
			logRejection(lg, e)
		}
	}
	if interval > 0 {
		s := &rejectSummary{logger: l, every: interval}
		onReject = func(e Event) {
			lg := l()
			if !lg.Enabled(ctx, slog.LevelWarn) {
				return
			}
			if s.count(e) {
				defer s.arm() // after the record, so that no summary comes before it
				logRejection(lg, e)
			}
		}
	}
	return Events{
		OnAdmit: func(e Event) {
			if lg := l(); lg.Enabled(ctx, slog.LevelDebug) {
				log(lg, slog.LevelDebug, "bulkhead: admitted", e, slog.Duration("waited", e.Waited))
			}
		},
		OnRelease: func(e Event) {
			if lg := l(); lg.Enabled(ctx, slog.LevelDebug) {
				log(lg, slog.LevelDebug, "bulkhead: released", e, slog.Duration("waited", e.Waited), slog.Duration("held", e.Held))
			}
		},
		OnReject: onReject,
		OnFleet: func(e FleetEvent) {
			lg := l()
			level, msg := slog.LevelInfo, "bulkhead: fleet share"
			if e.Err != nil {
				level, msg = slog.LevelWarn, "bulkhead: fleet coordination failed"
			}
			if !lg.Enabled(ctx, level) {
				return
			}
			attrs := []slog.Attr{slog.String("fleet", e.Fleet), slog.Int("instances", e.Instances), slog.Int("max_concurrent", e.MaxConcurrent), slog.Int("max_queue", e.MaxQueue)}
			if e.Err != nil {
				attrs = append(attrs, slog.String("error", e.Err.Error()))
			}
			lg.LogAttrs(ctx, level, msg, attrs...)
		},
	}
}

// rejectMessage is the message of a rejection's record, and of its summary.
func rejectMessage(dryRun bool) string {
	if dryRun {
		return "bulkhead: would reject (dry run)"
	}
	return "bulkhead: rejected"
}

// rejectReasons are the labels summaries count by: ReasonLabel's, indexed
// by reasonIndex.
var rejectReasons = [...]string{"admission_full", "queue_timeout", "no_connection", ""}

// reasonIndex is the index in rejectReasons of ReasonLabel(err), found
// without errors.Is for the sentinels the gate reports.
func reasonIndex(err error) int {
	switch err {
	case ErrAdmissionFull:
		return 0
	case ErrQueueTimeout:
		return 1
	case ErrNoConnection:
		return 2
	}
	return slices.Index(rejectReasons[:], ReasonLabel(err))
}

// rejectCounts are one workload's rejections by reason index and dry run.
type rejectCounts [len(rejectReasons)][2]int64

// rejectSummary counts rejections between summaries. A window opens with
// a rejection logged at once and arms a timer; each time the timer fires,
// the counts are logged and reset and the timer armed again, or, if there
// are none, the window closes.
type rejectSummary struct {
	logger func() *slog.Logger
	every  time.Duration

	mu    sync.Mutex
	open  bool      // a window is open: its timer is armed
	start time.Time // when the counts began
	// counts are the rejections since start, by workload. They are kept
	// at 0 while the window is open, so counting does not allocate.
	counts map[string]*rejectCounts
	// last is the entry of counts that counted last: under an overload,
	// most rejections are of the workload before them.
	lastWorkload string
	last         *rejectCounts
}

// count counts a rejection and reports whether it is to be logged at
// once: when no window is open, and it opens one. The caller then logs it
// and calls arm.
func (s *rejectSummary) count(e Event) (logNow bool) {
	r, d := reasonIndex(e.Reason), 0
	if e.DryRun {
		d = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.open {
		s.open = true
		s.start = time.Now()
		return true
	}
	c := s.last
	if c == nil || e.Workload != s.lastWorkload {
		c = s.counts[e.Workload]
		if c == nil {
			if s.counts == nil {
				s.counts = make(map[string]*rejectCounts)
			}
			c = new(rejectCounts)
			s.counts[e.Workload] = c
		}
		s.lastWorkload, s.last = e.Workload, c
	}
	c[r][d]++
	return false
}

// arm starts the timer of the window count opened.
func (s *rejectSummary) arm() { time.AfterFunc(s.every, s.flush) }

// groupCount is one summary record's content.
type groupCount struct {
	reason, workload string
	dryRun           bool
	n                int64
}

// flush, on the timer, logs the counts since the previous flush and arms
// the timer again, or closes the window if there were none.
func (s *rejectSummary) flush() {
	s.mu.Lock()
	var out []groupCount
	for w, c := range s.counts {
		for r := range c {
			for d, n := range c[r] {
				if n > 0 {
					out = append(out, groupCount{reason: rejectReasons[r], workload: w, dryRun: d == 1, n: n})
					c[r][d] = 0
				}
			}
		}
	}
	now := time.Now()
	over := now.Sub(s.start)
	s.start = now
	if len(out) == 0 {
		s.open = false
		clear(s.counts) // the workloads of a past overload need not stay
		s.lastWorkload, s.last = "", nil
	} else {
		s.arm()
	}
	s.mu.Unlock()

	if len(out) == 0 {
		return
	}
	ctx := context.Background()
	lg := s.logger()
	if !lg.Enabled(ctx, slog.LevelWarn) {
		return
	}
	slices.SortFunc(out, func(a, b groupCount) int {
		switch {
		case a.dryRun != b.dryRun:
			if a.dryRun {
				return 1
			}
			return -1
		case a.reason != b.reason:
			return cmp.Compare(a.reason, b.reason)
		}
		return cmp.Compare(a.workload, b.workload)
	})
	for _, g := range out {
		attrs := make([]slog.Attr, 0, 4)
		if g.workload != "" {
			attrs = append(attrs, slog.String("workload", g.workload))
		}
		attrs = append(attrs, slog.String("reason", g.reason), slog.Int64("count", g.n), slog.Duration("over", over))
		lg.LogAttrs(ctx, slog.LevelWarn, rejectMessage(g.dryRun), attrs...)
	}
}

// ReasonLabel names the cause of a rejection for logs and metric labels:
// "admission_full" for ErrAdmissionFull, "queue_timeout" for
// ErrQueueTimeout, "no_connection" for ErrNoConnection, checked with
// errors.Is so a rejection error or an Event.Reason both work; "" for
// anything else.
func ReasonLabel(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrAdmissionFull):
		return "admission_full"
	case errors.Is(err, ErrQueueTimeout):
		return "queue_timeout"
	case errors.Is(err, ErrNoConnection):
		return "no_connection"
	}
	return ""
}

// JoinEvents returns Events that call, for each callback, those of es in
// order, skipping nil ones; a callback that no element sets stays nil, so
// the gate skips it (and, for OnRelease, does not read the clock). Use it
// to feed one gate to several consumers, metrics and logs:
//
//	bulkhead.WithEvents(bulkhead.JoinEvents(metrics.Events(), bulkhead.SlogEvents(logger)))
func JoinEvents(es ...Events) Events {
	var admit, reject, release []func(Event)
	var fleet []func(FleetEvent)
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
		if e.OnFleet != nil {
			fleet = append(fleet, e.OnFleet)
		}
	}
	return Events{OnAdmit: fanOut(admit), OnReject: fanOut(reject), OnRelease: fanOut(release), OnFleet: fanOut(fleet)}
}

func fanOut[E any](fs []func(E)) func(E) {
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	return func(e E) {
		for _, f := range fs {
			f(e)
		}
	}
}
