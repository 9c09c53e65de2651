//go:build go1.25

package sloggate_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/gatetest"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
	"github.com/dbbulkhead/bulkhead/sloggate"
)

// recordLog is a slog.Handler that keeps every record it is given, as
// "LEVEL message key=value ..." lines with the durations left out (they
// are wall-clock), and the names of the duration attributes apart; and
// as logged values, for the tests that add up counts.
type recordLog struct {
	min   slog.Level
	mu    sync.Mutex
	lines []string
	durs  []string
	recs  []logged
}

// logged is a record as recordLog keeps it.
type logged struct {
	level slog.Level
	msg   string
	time  time.Time
	attrs map[string]slog.Value
}

func (h *recordLog) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
func (h *recordLog) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *recordLog) WithGroup(string) slog.Handler                { return h }

func (h *recordLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	var durs []string
	rec := logged{level: r.Level, msg: r.Message, time: r.Time, attrs: make(map[string]slog.Value)}
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value
		if a.Value.Kind() == slog.KindDuration {
			durs = append(durs, a.Key)
			return true
		}
		fmt.Fprintf(&b, " %s=%s", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, b.String())
	h.durs = append(h.durs, strings.Join(durs, ","))
	h.recs = append(h.recs, rec)
	return nil
}

func (h *recordLog) records() []logged {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.recs)
}

func (h *recordLog) got() (lines, durs []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines), slices.Clone(h.durs)
}

// wantLines fails the test unless h kept exactly the records want.
func (h *recordLog) wantLines(t *testing.T, want ...string) {
	t.Helper()
	if lines, _ := h.got(); !slices.Equal(lines, want) {
		t.Errorf("records %q, want %q", lines, want)
	}
}

// loggedDB opens a gate on a fake driver under p, logging its events to h;
// the *sql.DB is closed when the test ends.
func loggedDB(t *testing.T, h *recordLog, p bulkhead.Policy) *sql.DB {
	t.Helper()
	_, db := gatetest.Open(t, fakedb.New(), p, bulkhead.WithEvents(sloggate.Events(slog.New(h))))
	return db
}

// rejectBehindTx begins a transaction on db, holding its one permit, and
// fails the test unless a statement meanwhile is rejected with want. The
// transaction is left open.
func rejectBehindTx(t *testing.T, ctx context.Context, db *sql.DB, want error) *sql.Tx {
	t.Helper()
	tx := testkit.Begin(t, ctx, db)
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 1"); !errors.Is(err, want) {
		t.Fatalf("exec while the transaction holds the permit: %v, want %v", err, want)
	}
	return tx
}

func TestEventsLogsAdmitAndReleaseAtDebugAndRejectAtWarn(t *testing.T) {
	h := &recordLog{min: slog.LevelDebug}
	// B=1, Q=1 and a 1ns queue wait: a second operation while the first holds
	// its permit is admitted, then rejected at once with a queue timeout.
	db := loggedDB(t, h, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond})
	ctx := t.Context()
	tx := rejectBehindTx(t, ctx, db, bulkhead.ErrQueueTimeout)
	testkit.Commit(t, tx)
	testkit.Exec(t, ctx, db, "UPDATE t SET v = 2")

	lines, durs := h.got()
	want := []string{
		"DEBUG bulkhead: admitted kind=transaction",
		"WARN bulkhead: rejected kind=statement reason=queue_timeout",
		"DEBUG bulkhead: released kind=transaction",
		"DEBUG bulkhead: admitted kind=statement",
		"DEBUG bulkhead: released kind=statement",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("records:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	wantDurs := []string{"waited", "waited", "waited,held", "waited", "waited,held"}
	if !slices.Equal(durs, wantDurs) {
		t.Errorf("duration attributes %q, want %q", durs, wantDurs)
	}
}

func TestEventsLogsARejectionWithTheOperationsKind(t *testing.T) {
	h := &recordLog{min: slog.LevelDebug}
	// B=1, Q=0: the transaction holds the one permit, so the statement
	// is refused at admission.
	db := loggedDB(t, h, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0})
	tx := rejectBehindTx(t, t.Context(), db, bulkhead.ErrAdmissionFull)
	defer tx.Rollback()
	lines, _ := h.got()
	if want := "WARN bulkhead: rejected kind=statement reason=admission_full"; !slices.Contains(lines, want) {
		t.Errorf("records %q lack %q", lines, want)
	}
}

func TestEventsBuildsNoDebugRecordWhenTheLoggerIsAboveDebug(t *testing.T) {
	h := &recordLog{min: slog.LevelInfo}
	ev := sloggate.Events(slog.New(h))
	ev.OnAdmit(bulkhead.Event{Kind: bulkhead.KindQuery})
	ev.OnRelease(bulkhead.Event{Kind: bulkhead.KindQuery, Held: time.Millisecond})
	ev.OnReject(bulkhead.Event{Kind: bulkhead.KindQuery, Reason: bulkhead.ErrAdmissionFull})
	h.wantLines(t, "WARN bulkhead: rejected kind=query reason=admission_full")
	if n := testing.AllocsPerRun(100, func() { ev.OnAdmit(bulkhead.Event{Kind: bulkhead.KindQuery}) }); n != 0 {
		t.Errorf("a disabled debug record allocates %v times, want 0", n)
	}
}

func TestEventsWithANilLoggerUsesTheDefaultLoggerAtEachEvent(t *testing.T) {
	// Not parallel: it replaces the process's default logger.
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	synctest.Test(t, func(t *testing.T) {
		ev := sloggate.Events(nil) // made before the default is set
		h := &recordLog{min: slog.LevelDebug}
		slog.SetDefault(slog.New(h))
		ev.OnReject(bulkhead.Event{Kind: bulkhead.KindTx, Reason: bulkhead.ErrQueueTimeout})
		ev.OnReject(bulkhead.Event{Kind: bulkhead.KindTx, Reason: bulkhead.ErrQueueTimeout})
		// The summary goes to the default logger of the moment it is logged.
		h2 := &recordLog{min: slog.LevelDebug}
		slog.SetDefault(slog.New(h2))
		time.Sleep(sloggate.DefaultInterval)
		synctest.Wait()
		h.wantLines(t, "WARN bulkhead: rejected kind=transaction reason=queue_timeout")
		h2.wantLines(t, "WARN bulkhead: rejected reason=queue_timeout count=1")
	})
}

func TestEventsNamesTheWorkloadAndTellsADryRunRejectionApart(t *testing.T) {
	h := &recordLog{min: slog.LevelDebug}
	db := loggedDB(t, h, bulkhead.Policy{
		MaxConcurrent: 1, DryRun: true,
		Workloads: map[string]bulkhead.Workload{"reports": {MaxConcurrent: 1}},
	})
	ctx := bulkhead.WithWorkload(t.Context(), "reports")
	tx := testkit.Begin(t, ctx, db)
	// B=1, Q=0 in dry run: the second operation would be rejected, and runs.
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 1"); err != nil {
		t.Fatalf("dry run: %v, want no rejection", err)
	}
	testkit.Commit(t, tx)
	lines, _ := h.got()
	for _, want := range []string{
		"DEBUG bulkhead: admitted kind=transaction workload=reports",
		"WARN bulkhead: would reject (dry run) kind=statement workload=reports reason=admission_full",
		"DEBUG bulkhead: released kind=transaction workload=reports",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("records lack %q:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "bulkhead: rejected") }) {
		t.Errorf("a dry run logged a real rejection:\n%s", strings.Join(lines, "\n"))
	}
}

// rejectGroupOf names a record's (reason, workload, dry run) group.
func rejectGroupOf(r logged) string {
	workload := ""
	if w, ok := r.attrs["workload"]; ok {
		workload = w.String()
	}
	return fmt.Sprintf("%s/%s/%t", r.attrs["reason"], workload, r.msg == "bulkhead: would reject (dry run)")
}

func TestEventsSumsUpAnOverloadInOneRecordPerGroupAndInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &recordLog{min: slog.LevelDebug}
		ev := sloggate.Events(slog.New(h)) // DefaultInterval: 1 s
		start := time.Now()
		// Four goroutines, one group each, reject 50 times every 10 ms of
		// fake time for 5 s: 100,000 rejections, the last at 4.99 s. The
		// two on the global budget differ only in dry run; kinds vary
		// within a group.
		const steps, burst = 500, 50
		events := [][2]bulkhead.Event{
			{{Kind: bulkhead.KindExec, Reason: bulkhead.ErrAdmissionFull}, {Kind: bulkhead.KindQuery, Reason: bulkhead.ErrAdmissionFull}},
			{{Kind: bulkhead.KindExec, Reason: bulkhead.ErrAdmissionFull, DryRun: true}, {Kind: bulkhead.KindTx, Reason: bulkhead.ErrAdmissionFull, DryRun: true}},
			{{Kind: bulkhead.KindQuery, Workload: "reports", Reason: bulkhead.ErrQueueTimeout}, {Kind: bulkhead.KindQuery, Workload: "reports", Reason: bulkhead.ErrQueueTimeout}},
			{{Kind: bulkhead.KindTx, Workload: "reports", Reason: bulkhead.ErrAdmissionFull}, {Kind: bulkhead.KindExec, Workload: "reports", Reason: bulkhead.ErrAdmissionFull}},
		}
		var wg sync.WaitGroup
		for _, es := range events {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range steps {
					for i := range burst {
						ev.OnReject(es[i%2])
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		// The last summary is due at 5 s, and the window closes at 6 s.
		time.Sleep(2 * sloggate.DefaultInterval)
		synctest.Wait()

		recs := h.records()
		// The bound: one record at once, then, for each of the 5
		// intervals, one per group that had rejections: 4. The 100,000
		// rejections do not show in it.
		const groups, intervals = 4, 5
		total := int64(len(events) * steps * burst)
		if len(recs) != 1+groups*intervals {
			t.Fatalf("%d records, want 1 + %d groups × %d intervals = %d", len(recs), groups, intervals, 1+groups*intervals)
		}
		first := recs[0]
		if _, ok := first.attrs["count"]; ok || first.attrs["kind"].Kind() != slog.KindString || !first.time.Equal(start) {
			t.Errorf("first record %+v: want the rejection itself, logged at once", first)
		}
		perGroup := make(map[string]int64)
		perGroup[rejectGroupOf(first)]++
		for i, r := range recs[1:] {
			if r.level != slog.LevelWarn {
				t.Errorf("summary %+v: level %v, want WARN", r, r.level)
			}
			if _, ok := r.attrs["kind"]; ok {
				t.Errorf("summary %+v has a kind", r)
			}
			if w, ok := r.attrs["workload"]; ok && w.String() != "reports" {
				t.Errorf("summary %+v: workload %v", r, w)
			}
			// The records of the k-th interval are logged at k s, each
			// counting over 1 s.
			if at := start.Add(time.Duration(i/groups+1) * time.Second); !r.time.Equal(at) || r.attrs["over"].Duration() != time.Second {
				t.Errorf("summary %d at %v over %v, want at %v over 1s", i, r.time.Sub(start), r.attrs["over"], at.Sub(start))
			}
			perGroup[rejectGroupOf(r)] += r.attrs["count"].Int64()
		}
		want := map[string]int64{
			"admission_full//false":        total / groups,
			"admission_full//true":         total / groups,
			"queue_timeout/reports/false":  total / groups,
			"admission_full/reports/false": total / groups,
		}
		if !maps.Equal(perGroup, want) {
			t.Errorf("rejections logged per group %v, want %v", perGroup, want)
		}
	})
}

func TestEventsLogsTheFirstRejectionAtOnceAndAgainAfterAQuietInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = 100 * time.Millisecond
		h := &recordLog{min: slog.LevelWarn}
		ev := sloggate.EventsEvery(slog.New(h), every)
		full := bulkhead.Event{Kind: bulkhead.KindExec, Reason: bulkhead.ErrAdmissionFull}
		check := func(when string, want ...string) {
			t.Helper()
			synctest.Wait()
			if lines, _ := h.got(); !slices.Equal(lines, want) {
				t.Fatalf("%s: records\n%s\nwant\n%s", when, strings.Join(lines, "\n"), strings.Join(want, "\n"))
			}
		}
		ev.OnReject(full)
		ev.OnReject(full)
		ev.OnReject(full)
		r1 := "WARN bulkhead: rejected kind=statement reason=admission_full"
		check("three rejections", r1)
		time.Sleep(every - time.Nanosecond)
		check("just before the interval ends", r1)
		time.Sleep(time.Nanosecond)
		s2 := "WARN bulkhead: rejected reason=admission_full count=2"
		check("the interval ended", r1, s2)
		// A rejection in the next interval waits for its summary.
		time.Sleep(every / 2)
		ev.OnReject(full)
		check("a rejection right after a summary", r1, s2)
		time.Sleep(every / 2)
		s1 := "WARN bulkhead: rejected reason=admission_full count=1"
		check("the second interval ended", r1, s2, s1)
		// A quiet interval closes the window: the next rejection is logged at once.
		time.Sleep(every)
		check("a quiet interval", r1, s2, s1)
		ev.OnReject(full)
		check("a rejection after a quiet interval", r1, s2, s1, r1)
		time.Sleep(10 * every)
		check("alone", r1, s2, s1, r1)
	})
}

func TestEventsEveryWithoutAnIntervalLogsEachRejection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &recordLog{min: slog.LevelWarn}
		ev := sloggate.EventsEvery(slog.New(h), 0)
		for range 3 {
			ev.OnReject(bulkhead.Event{Kind: bulkhead.KindQuery, Workload: "reports", Reason: bulkhead.ErrQueueTimeout, DryRun: true})
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		r := "WARN bulkhead: would reject (dry run) kind=query workload=reports reason=queue_timeout"
		h.wantLines(t, r, r, r)
	})
}

func TestEventsCountsARejectionWithoutAllocating(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &recordLog{min: slog.LevelWarn}
		ev := sloggate.Events(slog.New(h))
		e := bulkhead.Event{Kind: bulkhead.KindQuery, Workload: "reports", Reason: bulkhead.ErrQueueTimeout}
		ev.OnReject(e) // logged at once; opens the interval
		ev.OnReject(e) // the group's first count
		// Fake time stands still while this goroutine runs: every call
		// below is counted in the same interval.
		if n := testing.AllocsPerRun(1000, func() { ev.OnReject(e) }); n != 0 {
			t.Errorf("a counted rejection allocates %v times, want 0", n)
		}
		time.Sleep(sloggate.DefaultInterval)
		synctest.Wait()
		recs := h.records()
		if len(recs) != 2 || recs[1].attrs["count"].Int64() != 1+1001 {
			t.Errorf("records %+v, want the rejection and a summary counting 1002", recs)
		}
	})
}

func TestEventsLogsNoRejectionThroughALoggerAboveWarn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &recordLog{min: slog.LevelError}
		ev := sloggate.Events(slog.New(h))
		e := bulkhead.Event{Kind: bulkhead.KindExec, Reason: bulkhead.ErrAdmissionFull}
		for range 1000 {
			ev.OnReject(e)
		}
		if n := testing.AllocsPerRun(1000, func() { ev.OnReject(e) }); n != 0 {
			t.Errorf("a rejection through a logger above Warn allocates %v times, want 0", n)
		}
		time.Sleep(10 * sloggate.DefaultInterval)
		synctest.Wait()
		h.wantLines(t) // none
	})
}

// BenchmarkEventsReject measures OnReject under an overload: "summed"
// (Events, one interval open: a counted rejection), from one goroutine
// and from GOMAXPROCS, and with the workload changing at each rejection;
// "each" (EventsEvery with interval 0: a record
// per rejection); "disabled" (a logger above Warn). The logger
// writes text to io.Discard.
func BenchmarkEventsReject(b *testing.B) {
	text := slog.New(slog.NewTextHandler(io.Discard, nil))
	e := bulkhead.Event{Kind: bulkhead.KindQuery, Workload: "reports", Reason: bulkhead.ErrQueueTimeout}
	serial := func(name string, events func() bulkhead.Events) {
		b.Run(name, func(b *testing.B) {
			ev := events()
			b.ReportAllocs()
			for b.Loop() {
				ev.OnReject(e)
			}
		})
	}
	serial("summed", func() bulkhead.Events { return sloggate.Events(text) })
	b.Run("summed-parallel", func(b *testing.B) {
		ev := sloggate.Events(text)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ev.OnReject(e)
			}
		})
	})
	b.Run("summed-3-workloads", func(b *testing.B) {
		ev := sloggate.Events(text)
		es := []bulkhead.Event{e, e, e}
		es[1].Workload, es[2].Workload = "", "batch"
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			ev.OnReject(es[i%3])
			i++
		}
	})
	serial("each", func() bulkhead.Events { return sloggate.EventsEvery(text, 0) })
	serial("disabled", func() bulkhead.Events { return sloggate.Events(slog.New(slog.DiscardHandler)) })
}
