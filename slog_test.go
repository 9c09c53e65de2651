//go:build go1.25

package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

// recordLog is a slog.Handler that keeps every record it is given, as
// "LEVEL message key=value ..." lines with the durations left out (they
// are wall-clock), and the names of the duration attributes apart.
type recordLog struct {
	min   slog.Level
	mu    sync.Mutex
	lines []string
	durs  []string
}

func (h *recordLog) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
func (h *recordLog) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *recordLog) WithGroup(string) slog.Handler                { return h }

func (h *recordLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	var durs []string
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
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
	return nil
}

func (h *recordLog) got() (lines, durs []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines), slices.Clone(h.durs)
}

func TestSlogEventsLogsAdmitAndReleaseAtDebugAndRejectAtWarn(t *testing.T) {
	h := &recordLog{min: slog.LevelDebug}
	// B=1, Q=1 and a 1ns queue wait: a second operation while the first holds
	// its permit is admitted, then rejected at once with a queue timeout.
	g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond},
		bulkhead.WithEvents(bulkhead.SlogEvents(slog.New(h))))
	if err != nil {
		t.Fatal(err)
	}
	db := g.OpenDB()
	defer db.Close()
	ctx := t.Context()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 1"); !errors.Is(err, bulkhead.ErrQueueTimeout) {
		t.Fatalf("exec while the transaction holds the permit: %v, want ErrQueueTimeout", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 2"); err != nil {
		t.Fatal(err)
	}

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

func TestSlogEventsLogsARejectionWithTheOperationsKind(t *testing.T) {
	h := &recordLog{min: slog.LevelDebug}
	// B=1, Q=0: the transaction holds the one permit, so the statement
	// is refused at admission.
	g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 0},
		bulkhead.WithEvents(bulkhead.SlogEvents(slog.New(h))))
	if err != nil {
		t.Fatal(err)
	}
	db := g.OpenDB()
	defer db.Close()
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := db.ExecContext(t.Context(), "UPDATE t SET v = 1"); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("exec while the transaction holds the permit: %v, want ErrAdmissionFull", err)
	}
	lines, _ := h.got()
	if want := "WARN bulkhead: rejected kind=statement reason=admission_full"; !slices.Contains(lines, want) {
		t.Errorf("records %q lack %q", lines, want)
	}
}

func TestSlogEventsBuildsNoDebugRecordWhenTheLoggerIsAboveDebug(t *testing.T) {
	h := &recordLog{min: slog.LevelInfo}
	ev := bulkhead.SlogEvents(slog.New(h))
	ev.OnAdmit(bulkhead.Event{Kind: bulkhead.KindQuery})
	ev.OnRelease(bulkhead.Event{Kind: bulkhead.KindQuery, Held: time.Millisecond})
	ev.OnReject(bulkhead.Event{Kind: bulkhead.KindQuery, Reason: bulkhead.ErrAdmissionFull})
	lines, _ := h.got()
	if want := []string{"WARN bulkhead: rejected kind=query reason=admission_full"}; !slices.Equal(lines, want) {
		t.Errorf("records %q, want %q", lines, want)
	}
	if n := testing.AllocsPerRun(100, func() { ev.OnAdmit(bulkhead.Event{Kind: bulkhead.KindQuery}) }); n != 0 {
		t.Errorf("a disabled debug record allocates %v times, want 0", n)
	}
}

func TestSlogEventsWithANilLoggerUsesTheDefaultLoggerAtEachEvent(t *testing.T) {
	// Not parallel: it replaces the process's default logger.
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	ev := bulkhead.SlogEvents(nil) // made before the default is set
	h := &recordLog{min: slog.LevelDebug}
	slog.SetDefault(slog.New(h))
	ev.OnReject(bulkhead.Event{Kind: bulkhead.KindTx, Reason: bulkhead.ErrQueueTimeout})
	lines, _ := h.got()
	if want := []string{"WARN bulkhead: rejected kind=transaction reason=queue_timeout"}; !slices.Equal(lines, want) {
		t.Errorf("records %q, want %q", lines, want)
	}
}

func TestJoinEventsCallsEachSetCallbackInOrderAndLeavesUnsetOnesNil(t *testing.T) {
	var calls []string
	rec := func(name string) func(bulkhead.Event) {
		return func(e bulkhead.Event) { calls = append(calls, name+":"+e.Kind.String()) }
	}
	j := bulkhead.JoinEvents(
		bulkhead.Events{OnAdmit: rec("a1"), OnRelease: rec("r1")},
		bulkhead.Events{},
		bulkhead.Events{OnAdmit: rec("a2")},
	)
	if j.OnReject != nil {
		t.Error("OnReject is set, want nil: no element sets it")
	}
	j.OnAdmit(bulkhead.Event{Kind: bulkhead.KindTx})
	j.OnRelease(bulkhead.Event{Kind: bulkhead.KindExec})
	if want := []string{"a1:transaction", "a2:transaction", "r1:statement"}; !slices.Equal(calls, want) {
		t.Errorf("calls %q, want %q", calls, want)
	}
	if e := bulkhead.JoinEvents(); e.OnAdmit != nil || e.OnReject != nil || e.OnRelease != nil {
		t.Error("JoinEvents() has a callback set, want none")
	}
}

func TestReasonLabelNamesBothRejectionCausesAndNothingElse(t *testing.T) {
	g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	db := g.OpenDB()
	defer db.Close()
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, timeout := db.ExecContext(t.Context(), "UPDATE t SET v = 1")
	for _, c := range []struct {
		err  error
		want string
	}{
		{bulkhead.ErrAdmissionFull, "admission_full"},
		{bulkhead.ErrQueueTimeout, "queue_timeout"},
		{fmt.Errorf("save order: %w", timeout), "queue_timeout"},
		{bulkhead.ErrRejected, ""},
		{bulkhead.ErrClosed, ""},
		{context.Canceled, ""},
		{nil, ""},
	} {
		if got := bulkhead.ReasonLabel(c.err); got != c.want {
			t.Errorf("ReasonLabel(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestSlogEventsNamesTheWorkloadAndTellsADryRunRejectionApart(t *testing.T) {
	h := &recordLog{min: slog.LevelDebug}
	g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{
		MaxConcurrent: 1, DryRun: true,
		Workloads: map[string]bulkhead.Workload{"reports": {MaxConcurrent: 1}},
	}, bulkhead.WithEvents(bulkhead.SlogEvents(slog.New(h))))
	if err != nil {
		t.Fatal(err)
	}
	db := g.OpenDB()
	defer db.Close()
	ctx := bulkhead.WithWorkload(t.Context(), "reports")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// B=1, Q=0 in dry run: the second operation would be rejected, and runs.
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 1"); err != nil {
		t.Fatalf("dry run: %v, want no rejection", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
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
