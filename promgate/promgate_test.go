package promgate_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/fleet"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/gatetest"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
	"github.com/dbbulkhead/bulkhead/promgate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gated opens a gate on the fake driver with the collector's events and
// attaches it.
func gated(t *testing.T, c *promgate.Collector, p bulkhead.Policy) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	return gatedOn(t, c, fakedb.New(), p)
}

// gatedOn is gated on the fake driver fc.
func gatedOn(t *testing.T, c *promgate.Collector, fc *fakedb.Connector, p bulkhead.Policy) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	g, db := gatetest.Open(t, fc, p, bulkhead.WithEvents(c.Events()))
	c.Attach(g)
	return g, db
}

// statsHelp is the exposition of the Stats-derived metrics, with a %d
// for each value of statsWant in order.
const statsHelp = `
# HELP bulkhead_running Operations holding an execution permit.
# TYPE bulkhead_running gauge
bulkhead_running %d
# HELP bulkhead_waiting Admitted operations waiting for an execution permit.
# TYPE bulkhead_waiting gauge
bulkhead_waiting %d
# HELP bulkhead_open_connections Server connections open, or being dialed, by the gate.
# TYPE bulkhead_open_connections gauge
bulkhead_open_connections %d
# HELP bulkhead_idle_connections Server connections idle in the gate.
# TYPE bulkhead_idle_connections gauge
bulkhead_idle_connections %d
# HELP bulkhead_admitted_total Operations that got their permits and a server connection, and ran.
# TYPE bulkhead_admitted_total counter
bulkhead_admitted_total %d
# HELP bulkhead_rejections_total Operations rejected, by reason: admission_full (refused at once), queue_timeout (no execution permit within the queue wait), would_miss_deadline (it could not have finished within its context's deadline) or lease_expired (a fleet lease ran out and its fallback share had no room); in a dry run, those that would have been.
# TYPE bulkhead_rejections_total counter
bulkhead_rejections_total{reason="admission_full"} %d
bulkhead_rejections_total{reason="lease_expired"} %d
bulkhead_rejections_total{reason="queue_timeout"} %d
bulkhead_rejections_total{reason="would_miss_deadline"} %d
# HELP bulkhead_canceled_total Operations whose context ended, or whose gate closed, before they ran.
# TYPE bulkhead_canceled_total counter
bulkhead_canceled_total %d
# HELP bulkhead_dials_total Server connections dialed, failed dials included.
# TYPE bulkhead_dials_total counter
bulkhead_dials_total %d
`

var statsNames = []string{
	"bulkhead_running", "bulkhead_waiting", "bulkhead_open_connections", "bulkhead_idle_connections", "bulkhead_admitted_total",
	"bulkhead_rejections_total", "bulkhead_canceled_total", "bulkhead_dials_total",
}

type statsWant struct {
	running, waiting, open, idle, admitted, full, timeout, late, canceled, dials int
}

func compareStats(t *testing.T, c prometheus.Collector, w statsWant) {
	t.Helper()
	compare(t, c, fmt.Sprintf(statsHelp, w.running, w.waiting, w.open, w.idle, w.admitted, w.full, 0, w.timeout, w.late, w.canceled, w.dials), statsNames...)
}

// compare fails the test unless the series of the metrics names that c
// collects are exactly the exposition text.
func compare(t *testing.T, c prometheus.Collector, text string, names ...string) {
	t.Helper()
	if err := testutil.CollectAndCompare(c, strings.NewReader(text), names...); err != nil {
		t.Error(err)
	}
}

// lintClean fails the test unless c's metrics pass the Prometheus linter.
func lintClean(t *testing.T, c prometheus.Collector) {
	t.Helper()
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

func TestCollectorReportsTheGateStatsAsTheyAreAtCollectTime(t *testing.T) {
	c := promgate.New(promgate.Opts{})
	// B=1, Q=1, a long queue wait: the second operation waits until the
	// test cancels it; a third is refused at once.
	gate, db := gated(t, c, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour})
	ctx := t.Context()

	limits := `
# HELP bulkhead_max_concurrent Execution permits (B): operations that may run at once.
# TYPE bulkhead_max_concurrent gauge
bulkhead_max_concurrent 1
# HELP bulkhead_max_queue Admission permits beyond max_concurrent (Q): operations that may wait for an execution permit.
# TYPE bulkhead_max_queue gauge
bulkhead_max_queue 1
# HELP bulkhead_max_queue_wait_seconds Longest an admitted operation waits for an execution permit before it is rejected.
# TYPE bulkhead_max_queue_wait_seconds gauge
bulkhead_max_queue_wait_seconds 3600
`
	compare(t, c, limits, "bulkhead_max_concurrent", "bulkhead_max_queue", "bulkhead_max_queue_wait_seconds")
	compareStats(t, c, statsWant{})

	tx := testkit.Begin(t, ctx, db)
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := testkit.GoExec(waitCtx, db, "UPDATE t SET v = 1")
	testkit.Await(t, "the second operation waits", func() bool { return gate.Stats().Waiting == 1 })
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 2"); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("third operation: %v, want ErrAdmissionFull", err)
	}
	// One server connection, the transaction's: the waiting and the
	// refused operations hold none.
	compareStats(t, c, statsWant{running: 1, waiting: 1, open: 1, admitted: 1, full: 1, dials: 1})

	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v, want context.Canceled", err)
	}
	testkit.Commit(t, tx)
	compareStats(t, c, statsWant{open: 1, idle: 1, admitted: 1, full: 1, canceled: 1, dials: 1})

	// Only the transaction was admitted, and it did not wait: every bucket
	// holds it. An untagged operation's workload label is empty, which
	// Prometheus reads as absent.
	wait := `
# HELP bulkhead_queue_wait_seconds Time each admitted operation waited for its permits (0 when they were free), by workload ("" for none).
# TYPE bulkhead_queue_wait_seconds histogram
`
	for _, le := range strings.Fields("0.0001 0.00025 0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 +Inf") {
		wait += fmt.Sprintf("bulkhead_queue_wait_seconds_bucket{workload=\"\",le=%q} 1\n", le)
	}
	wait += `bulkhead_queue_wait_seconds_sum{workload=""} 0
bulkhead_queue_wait_seconds_count{workload=""} 1
`
	compare(t, c, wait, "bulkhead_queue_wait_seconds")
}

func TestCollectorCountsQueueTimeoutsApartFromAdmissionFull(t *testing.T) {
	c := promgate.New(promgate.Opts{})
	// B=1, Q=1 and a 1ns queue wait: the second operation is admitted, then
	// rejected at once because no execution permit is free.
	_, db := gated(t, c, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond})
	tx := testkit.Begin(t, t.Context(), db)
	defer tx.Rollback()
	if _, err := db.ExecContext(t.Context(), "UPDATE t SET v = 1"); !errors.Is(err, bulkhead.ErrQueueTimeout) {
		t.Fatalf("second operation: %v, want ErrQueueTimeout", err)
	}
	compareStats(t, c, statsWant{running: 1, open: 1, admitted: 1, timeout: 1, dials: 1})
	// The rejected statement was never admitted nor released: the
	// histograms saw the transaction's admission alone.
	got := histograms(t, c)
	if got["bulkhead_queue_wait_seconds{}"] != 1 || got["bulkhead_hold_seconds{statement}"] != 0 {
		t.Errorf("histogram counts %v, want one wait and no hold", got)
	}
}

// histograms gathers c and returns the sample count of each histogram
// series, keyed by name and non-empty label values
// ("bulkhead_hold_seconds{transaction}", "bulkhead_hold_seconds{query,reports}").
func histograms(t *testing.T, c prometheus.Collector) map[string]uint64 {
	t.Helper()
	counts := map[string]uint64{}
	for _, mf := range gather(t, c) {
		if mf.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				if l.GetValue() != "" {
					labels = append(labels, l.GetValue())
				}
			}
			counts[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetHistogram().GetSampleCount()
		}
	}
	return counts
}

func TestHistogramsObserveEachAdmittedWaitAndEachHoldByKind(t *testing.T) {
	c := promgate.New(promgate.Opts{})
	gate, db := gated(t, c, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour})
	ctx := t.Context()

	tx := testkit.Begin(t, ctx, db)
	waited := testkit.GoExec(ctx, db, "UPDATE t SET v = 1")
	testkit.Await(t, "the statement waits", func() bool { return gate.Stats().Waiting == 1 })
	testkit.Commit(t, tx)
	if err := <-waited; err != nil {
		t.Fatalf("the statement that waited: %v", err)
	}
	var v int
	if err := db.QueryRowContext(ctx, "SELECT 7").Scan(&v); err != nil || v != 7 {
		t.Fatalf("query: %d, %v", v, err)
	}

	got := histograms(t, c)
	want := map[string]uint64{
		"bulkhead_queue_wait_seconds{}":      3,
		"bulkhead_hold_seconds{transaction}": 1,
		"bulkhead_hold_seconds{statement}":   1,
		"bulkhead_hold_seconds{query}":       1,
	}
	if !maps.Equal(got, want) {
		t.Errorf("observations by histogram series %v, want exactly %v", got, want)
	}
	if s := gate.Stats(); s.Admitted != 3 || s.WaitCount != 1 {
		t.Errorf("stats %+v, want 3 admitted, 1 of them after a wait", s)
	}
}

func TestCollectorsOfTwoGatesShareARegistryAndPassLint(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for _, db := range []string{"orders", "users"} {
		c := promgate.New(promgate.Opts{ConstLabels: prometheus.Labels{"db": db}})
		_, sdb := gated(t, c, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Second})
		testkit.Exec(t, t.Context(), sdb, "UPDATE t SET v = 1")
		reg.MustRegister(c)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	want := `
# HELP bulkhead_admitted_total Operations that got their permits and a server connection, and ran.
# TYPE bulkhead_admitted_total counter
bulkhead_admitted_total{db="orders"} 1
bulkhead_admitted_total{db="users"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "bulkhead_admitted_total"); err != nil {
		t.Error(err)
	}
	// 8 gauges + 12 counter series + 1 wait histogram + 3 hold histograms, per gate.
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 2*24 {
		t.Errorf("gathered %d series (%v), want %d", n, err, 2*24)
	}
}

func TestNamespacePrefixesEveryMetricName(t *testing.T) {
	c := promgate.New(promgate.Opts{Namespace: "shop"})
	gated(t, c, bulkhead.Policy{MaxConcurrent: 1})
	mfs := gather(t, c)
	// Without workloads, the bulkhead_workload_ families are empty: not gathered.
	if len(mfs) != 19 {
		t.Errorf("%d metric families, want 19", len(mfs))
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "shop_bulkhead_") {
			t.Errorf("metric %s lacks the prefix shop_bulkhead_", mf.GetName())
		}
	}
}

func TestCollectorWithoutAGateCollectsTheHistogramsAlone(t *testing.T) {
	c := promgate.New(promgate.Opts{})
	if n := testutil.CollectAndCount(c); n != 4 {
		t.Errorf("collected %d series, want 4: the wait histogram and one hold histogram per kind", n)
	}
	if n := testutil.CollectAndCount(c, "bulkhead_running"); n != 0 {
		t.Errorf("collected bulkhead_running without a gate")
	}
}

func TestEventsObserveWithoutAllocating(t *testing.T) {
	ev := promgate.New(promgate.Opts{}).Events()
	n := testing.AllocsPerRun(100, func() {
		ev.OnAdmit(bulkhead.Event{Kind: bulkhead.KindExec, Waited: time.Millisecond})
		ev.OnRelease(bulkhead.Event{Kind: bulkhead.KindExec, Held: time.Millisecond})
	})
	if n != 0 {
		t.Errorf("an admit and a release allocate %v times, want 0", n)
	}
}

func TestCollectorReportsEachWorkloadInItsOwnFamilies(t *testing.T) {
	c := promgate.New(promgate.Opts{})
	gate, db := gated(t, c, bulkhead.Policy{
		MaxConcurrent: 2, MaxQueue: 0,
		Workloads: map[string]bulkhead.Workload{"reports": {MaxConcurrent: 1}, "api": {MaxConcurrent: 2}},
	})
	ctx := bulkhead.WithWorkload(t.Context(), "reports")
	tx := testkit.Begin(t, ctx, db)
	// The workload's one permit is held: its next operation is rejected,
	// while the global budget still has room.
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 1"); !errors.Is(err, bulkhead.ErrRejected) {
		t.Fatalf("second operation of the workload: %v, want a rejection", err)
	}
	if _, err := db.ExecContext(t.Context(), "UPDATE t SET v = 2"); err != nil {
		t.Fatalf("untagged operation: %v", err)
	}
	testkit.Commit(t, tx)
	want := `
# HELP bulkhead_workload_admitted_total Operations that got their permits and a server connection, and ran.
# TYPE bulkhead_workload_admitted_total counter
bulkhead_workload_admitted_total{workload="api"} 0
bulkhead_workload_admitted_total{workload="reports"} 1
# HELP bulkhead_workload_max_concurrent Execution permits (B): operations that may run at once.
# TYPE bulkhead_workload_max_concurrent gauge
bulkhead_workload_max_concurrent{workload="api"} 2
bulkhead_workload_max_concurrent{workload="reports"} 1
# HELP bulkhead_workload_rejections_total Operations rejected, by reason: admission_full (refused at once), queue_timeout (no execution permit within the queue wait), would_miss_deadline (it could not have finished within its context's deadline) or lease_expired (a fleet lease ran out and its fallback share had no room); in a dry run, those that would have been.
# TYPE bulkhead_workload_rejections_total counter
bulkhead_workload_rejections_total{reason="admission_full",workload="api"} 0
bulkhead_workload_rejections_total{reason="admission_full",workload="reports"} 1
bulkhead_workload_rejections_total{reason="lease_expired",workload="api"} 0
bulkhead_workload_rejections_total{reason="lease_expired",workload="reports"} 0
bulkhead_workload_rejections_total{reason="queue_timeout",workload="api"} 0
bulkhead_workload_rejections_total{reason="would_miss_deadline",workload="api"} 0
bulkhead_workload_rejections_total{reason="queue_timeout",workload="reports"} 0
bulkhead_workload_rejections_total{reason="would_miss_deadline",workload="reports"} 0
# HELP bulkhead_admitted_total Operations that got their permits and a server connection, and ran.
# TYPE bulkhead_admitted_total counter
bulkhead_admitted_total 2
`
	compare(t, c, want, "bulkhead_workload_admitted_total", "bulkhead_workload_max_concurrent", "bulkhead_workload_rejections_total", "bulkhead_admitted_total")
	got := histograms(t, c)
	if got["bulkhead_hold_seconds{transaction,reports}"] != 1 || got["bulkhead_hold_seconds{statement}"] != 1 ||
		got["bulkhead_queue_wait_seconds{reports}"] != 1 || got["bulkhead_queue_wait_seconds{}"] != 1 {
		t.Errorf("histogram counts %v, want the workload's transaction and the untagged statement apart", got)
	}
	if s := gate.Stats(); s.Running != 0 {
		t.Errorf("%d running, want 0", s.Running)
	}
	lintClean(t, c)
}

func TestCollectorReportsADryRunAndWhatWouldHaveWaited(t *testing.T) {
	c := promgate.New(promgate.Opts{})
	_, db := gated(t, c, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Second, DryRun: true})
	tx := testkit.Begin(t, t.Context(), db)
	// B=1 in dry run: the second operation would have waited, and runs.
	if _, err := db.ExecContext(t.Context(), "UPDATE t SET v = 1"); err != nil {
		t.Fatalf("dry run: %v", err)
	}
	testkit.Commit(t, tx)
	want := `
# HELP bulkhead_dry_run 1 while the policy is a dry run: rejections are counted and reported, not made.
# TYPE bulkhead_dry_run gauge
bulkhead_dry_run 1
# HELP bulkhead_would_wait_total Dry run: operations that found no execution permit free and ran anyway.
# TYPE bulkhead_would_wait_total counter
bulkhead_would_wait_total 1
`
	compare(t, c, want, "bulkhead_dry_run", "bulkhead_would_wait_total")
}

// On the fake driver the fleet's coordination fails (it knows no
// pg_locks): the fleet metrics show the member degraded, with no share.
func TestCollectorReportsTheFleetOnlyForAFleetMember(t *testing.T) {
	c := promgate.New(promgate.Opts{})
	m, err := fleet.Join("orders", fakedb.New(), bulkhead.Policy{MaxConcurrent: 8}, fleet.Interval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Gate().OpenDB().Close()
	c.Attach(m.Gate())
	c.AttachFleet(m)
	testkit.Await(t, "the loop's first round", func() bool { return m.Stats().Rounds > 0 })
	if err := m.Sync(t.Context()); !errors.Is(err, fleet.ErrCoordination) {
		t.Fatalf("Sync on the fake driver: %v, want ErrCoordination", err)
	}
	rounds := m.Stats().Rounds // the loop's first round, and ours: 2
	want := fmt.Sprintf(`
# HELP bulkhead_fleet_degraded 1 while the fleet coordination fails: the share is at most the fallback.
# TYPE bulkhead_fleet_degraded gauge
bulkhead_fleet_degraded{fleet="orders"} 1
# HELP bulkhead_fleet_failures_total Fleet coordination rounds that failed.
# TYPE bulkhead_fleet_failures_total counter
bulkhead_fleet_failures_total{fleet="orders"} %d
# HELP bulkhead_fleet_instances Members of the fleet alive at the last successful coordination round.
# TYPE bulkhead_fleet_instances gauge
bulkhead_fleet_instances{fleet="orders"} 0
# HELP bulkhead_fleet_max_concurrent T: the execution permits of the whole fleet (the policy's MaxConcurrent).
# TYPE bulkhead_fleet_max_concurrent gauge
bulkhead_fleet_max_concurrent{fleet="orders"} 8
# HELP bulkhead_fleet_orphans Busy server connections beyond their member's slots (a killed one's, or one's without coordination), at the last successful round: the shares leave room for them.
# TYPE bulkhead_fleet_orphans gauge
bulkhead_fleet_orphans{fleet="orders"} 0
# HELP bulkhead_fleet_rounds_total Fleet coordination rounds.
# TYPE bulkhead_fleet_rounds_total counter
bulkhead_fleet_rounds_total{fleet="orders"} %d
# HELP bulkhead_fleet_share This member's share of the fleet's execution permits.
# TYPE bulkhead_fleet_share gauge
bulkhead_fleet_share{fleet="orders"} 0
# HELP bulkhead_max_concurrent Execution permits (B): operations that may run at once.
# TYPE bulkhead_max_concurrent gauge
bulkhead_max_concurrent 0
`, rounds, rounds)
	names := []string{"bulkhead_fleet_degraded", "bulkhead_fleet_failures_total", "bulkhead_fleet_instances", "bulkhead_fleet_orphans", "bulkhead_fleet_rounds_total", "bulkhead_fleet_share", "bulkhead_fleet_max_concurrent", "bulkhead_max_concurrent"}
	compare(t, c, want, names...)
	lintClean(t, c)
	// A gate alone has no fleet series.
	c2 := promgate.New(promgate.Opts{})
	gated(t, c2, bulkhead.Policy{MaxConcurrent: 1})
	if n := testutil.CollectAndCount(c2, names[:7]...); n != 0 {
		t.Errorf("%d fleet series for a gate outside a fleet, want 0", n)
	}
}

// A dial that fails fails the operation that needed it: the collector
// counts the failed dial in bulkhead_dial_errors_total, whoever asked for
// it (two operations and a Ping here), and the operation in
// bulkhead_connect_failed_total, as the gate's Stats do; once dials
// succeed again, the next operation is admitted.
func TestCollectorCountsFailedDialsAndTheOperationsTheyFailed(t *testing.T) {
	c := promgate.New(promgate.Opts{})
	fc := fakedb.New()
	refused := errors.New("fake dial refused")
	fc.FailNext(fakedb.OpConnect, 3, refused)
	g, db := gatedOn(t, c, fc, bulkhead.Policy{MaxConcurrent: 1, QueueWait: time.Hour})
	ctx := t.Context()

	counters := func() map[string]float64 {
		t.Helper()
		got := map[string]float64{}
		for _, mf := range gather(t, c) {
			if mf.GetType() == dto.MetricType_COUNTER && len(mf.GetMetric()) == 1 {
				got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return got
	}
	check := func(when string, dials, dialErrors, connectFailed, admitted float64) {
		t.Helper()
		got := counters()
		for _, w := range []struct {
			name string
			want float64
		}{
			{"bulkhead_dials_total", dials},
			{"bulkhead_dial_errors_total", dialErrors},
			{"bulkhead_connect_failed_total", connectFailed},
			{"bulkhead_admitted_total", admitted},
		} {
			if v, ok := got[w.name]; !ok || v != w.want {
				t.Errorf("%s: %s = %v (exported: %v), want %v", when, w.name, v, ok, w.want)
			}
		}
		if s := g.Stats(); float64(s.Dials) != dials || float64(s.DialErrors) != dialErrors || float64(s.ConnectFailed) != connectFailed {
			t.Errorf("%s: Stats Dials=%d DialErrors=%d ConnectFailed=%d, want %v, %v, %v", when, s.Dials, s.DialErrors, s.ConnectFailed, dials, dialErrors, connectFailed)
		}
	}

	const failedOps = 2
	for i := range failedOps {
		if _, err := db.ExecContext(ctx, "UPDATE t SET v = 1"); !errors.Is(err, refused) {
			t.Fatalf("operation %d with dials failing: %v, want the dial's error", i+1, err)
		}
	}
	check("after two operations whose dial failed", failedOps, failedOps, failedOps, 0)
	// A Ping takes no permit: its failed dial is a dial error, not a
	// failed operation.
	if err := db.PingContext(ctx); !errors.Is(err, refused) {
		t.Fatalf("Ping with dials failing: %v, want the dial's error", err)
	}
	check("after a Ping whose dial failed", failedOps+1, failedOps+1, failedOps, 0)
	if _, err := db.ExecContext(ctx, "UPDATE t SET v = 1"); err != nil {
		t.Fatalf("an operation once dials succeed: %v", err)
	}
	check("after an operation whose dial succeeded", failedOps+2, failedOps+1, failedOps, 1)
}

// Under Policy.Adaptive the collector says why B is where it is: the moves
// by why, and the signal read at the last one.
func TestTheCollectorSaysWhyAdaptiveBMoved(t *testing.T) {
	c := promgate.New(promgate.Opts{})
	g, db := gated(t, c, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 16, QueueWait: time.Second, Adaptive: true})
	var wg sync.WaitGroup
	for range 8 { // callers always waiting: B doubles from the floor
		wg.Go(func() {
			for range 200 {
				if _, err := db.Exec("UPDATE t"); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	m := g.Stats().LastMove
	if m.Why == "" {
		t.Fatalf("Stats().LastMove %+v after 1,600 operations with callers waiting, want a move", m)
	}
	n, err := testutil.GatherAndCount(prometheusRegistry(c), "bulkhead_adaptive_moves_total", "bulkhead_adaptive_last_move_queued")
	if err != nil || n < 2 {
		t.Fatalf("%d series of the adaptive metrics (%v), want the moves by why and the last move", n, err)
	}
}

// prometheusRegistry is a pedantic registry holding c alone.
func prometheusRegistry(c prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	return reg
}

// gather gathers c through a pedantic registry, failing the test on an
// error.
func gather(t *testing.T, c prometheus.Collector) []*dto.MetricFamily {
	t.Helper()
	mfs, err := prometheusRegistry(c).Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}
