// Package sloggate logs a bulkhead.Gate's decisions through log/slog:
//
//	g, err := bulkhead.New(connector, policy, bulkhead.WithEvents(sloggate.Events(logger)))
package sloggate

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// Events returns bulkhead.Events that log through logger (slog.Default() when
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
func Events(logger *slog.Logger) bulkhead.Events { return events(logger, time.Second) }

func events(logger *slog.Logger, every time.Duration) bulkhead.Events {
	get := func() *slog.Logger {
		if logger != nil {
			return logger
		}
		return slog.Default()
	}
	ctx := context.Background()
	log := func(level slog.Level, msg string, e bulkhead.Event, attrs ...slog.Attr) {
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
	return bulkhead.Events{
		OnAdmit: func(e bulkhead.Event) {
			log(slog.LevelDebug, "bulkhead: admitted", e, slog.Duration("waited", e.Waited))
		},
		OnRelease: func(e bulkhead.Event) {
			log(slog.LevelDebug, "bulkhead: released", e, slog.Duration("waited", e.Waited), slog.Duration("held", e.Held))
		},
		OnReject: func(e bulkhead.Event) {
			if !get().Enabled(ctx, slog.LevelWarn) {
				return
			}
			if s.every <= 0 || s.count(e) {
				log(slog.LevelWarn, rejectMessage(e.DryRun), e, slog.String("reason", bulkhead.ReasonLabel(e.Reason)), slog.Duration("waited", e.Waited))
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
func (s *summary) count(e bulkhead.Event) (now bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.open {
		s.open, s.start = true, time.Now()
		return true
	}
	if s.counts == nil {
		s.counts = map[group]int64{}
	}
	s.counts[group{bulkhead.ReasonLabel(e.Reason), e.Workload, e.DryRun}]++
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
