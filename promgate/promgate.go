// Package promgate exports the state of a bulkhead.Gate as Prometheus
// metrics.
//
// A Collector reads the gate's Stats when it is collected (the gauges and
// counters below) and observes the gate's events (the histograms), so it
// is made before the gate and attached to it after:
//
//	metrics := promgate.New(promgate.Opts{ConstLabels: prometheus.Labels{"db": "orders"}})
//	g, err := bulkhead.New(connector, policy, bulkhead.WithEvents(metrics.Events()))
//	if err != nil { ... }
//	metrics.Attach(g)
//	prometheus.MustRegister(metrics)
//
// To log the events as well, join them: bulkhead.WithEvents(
// bulkhead.JoinEvents(metrics.Events(), sloggate.Events(logger))).
// Several gates (one per database) each get their own Collector, told
// apart by ConstLabels, and may share one registry.
//
// Metrics, with Opts.Namespace "" (a namespace "app" makes app_bulkhead_…):
//
//	bulkhead_running                       gauge      operations holding an execution permit
//	bulkhead_waiting                       gauge      admitted operations waiting for an execution permit
//	bulkhead_open_connections              gauge      server connections open (or being dialed) by the gate
//	bulkhead_idle_connections              gauge      server connections idle in the gate
//	bulkhead_max_concurrent                gauge      B, the execution permits
//	bulkhead_max_queue                     gauge      Q, the admission permits beyond B
//	bulkhead_max_queue_wait_seconds        gauge      the policy's QueueWait
//	bulkhead_admitted_total                counter    operations that got their permits and a server connection
//	bulkhead_rejections_total{reason}      counter    reason="admission_full", "queue_timeout", "would_miss_deadline" or "lease_expired"
//	bulkhead_connect_failed_total          counter    operations that had their permits, then no server connection: the dial failed
//	bulkhead_canceled_total                counter    operations whose context ended (or gate closed) before they ran
//	bulkhead_dials_total                   counter    server connections dialed, failed dials included
//	bulkhead_dial_errors_total             counter    dials that failed, whoever asked (operations, Ping, Prepare, Raw)
//	bulkhead_bad_connections_total         counter    server connections closed because the driver found them bad
//	bulkhead_unknown_workload_total        counter    operations naming a workload the policy lacks (they pass the global budget alone)
//	bulkhead_dry_run                       gauge      1 while the policy is a dry run (rejections counted, not made)
//	bulkhead_would_wait_total              counter    dry run: operations that found no execution permit free and ran anyway
//	bulkhead_queue_wait_seconds{workload}  histogram  wait for the permits of each admitted operation (0 if none)
//	bulkhead_hold_seconds{kind,workload}   histogram  time each operation held its permits; kind="transaction", "statement" or "query"
//	bulkhead_adaptive_moves_total{why}     counter    Policy.Adaptive: moves of B, by why (Move.Why)
//	bulkhead_adaptive_last_move_queued{why} gauge     Policy.Adaptive: the operations waiting inside the database read at the last move, and why it moved
//
// For a fleet member (package fleet), attached with AttachFleet, with a
// fleet label (bulkhead_max_concurrent and bulkhead_max_queue are then
// this process's share):
//
//	bulkhead_fleet_max_concurrent{fleet}   gauge      T, the fleet's execution permits (the policy's MaxConcurrent)
//	bulkhead_fleet_instances{fleet}        gauge      members of the fleet alive at the last successful coordination round
//	bulkhead_fleet_share{fleet}            gauge      this member's share of T
//	bulkhead_fleet_orphans{fleet}          gauge      busy server connections beyond their member's slots, at the last successful round: the shares leave room for them
//	bulkhead_fleet_degraded{fleet}         gauge      1 while coordination fails: the share is at most the fallback
//	bulkhead_fleet_rounds_total{fleet}     counter    coordination rounds
//	bulkhead_fleet_failures_total{fleet}   counter    coordination rounds that failed
//
// For each workload of the policy (Policy.Workloads), the same gauges and
// counters of its own budget, with a workload label, in families of their
// own so that summing them never double-counts the global ones (every
// operation of a workload also counts globally):
//
//	bulkhead_workload_running{workload}, _waiting, _max_concurrent, _max_queue,
//	_max_queue_wait_seconds, _admitted_total, _rejections_total{workload,reason},
//	_connect_failed_total, _canceled_total, _would_wait_total
//
// The histograms' workload label is "" (absent) for untagged operations.
// The gauges and counters are read from Gate.Stats and Gate.WorkloadStats
// at each collection, so the limits follow Gate.SetPolicy, and are exact
// whether or not the events are wired (a
// workload removed from the policy disappears; added again, its counters
// restart from 0, which Prometheus reads as a counter reset); the
// histograms count only what happened while the gate had the Collector's
// Events.
package promgate

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/fleet"
)

// Default histogram buckets, in seconds. Queue waits are bounded by the
// policy's QueueWait (100 ms by default), so their buckets stop at 1 s;
// permit hold times are those of statements and transactions.
var (
	DefaultWaitBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	DefaultHoldBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
)

// Opts configures a Collector. The zero value is ready to use.
type Opts struct {
	// Namespace, if set, prefixes every metric name: "app" gives
	// app_bulkhead_running.
	Namespace string
	// ConstLabels are added to every metric, e.g. {"db": "orders"} to tell
	// the gates of several databases apart.
	ConstLabels prometheus.Labels
	// WaitBuckets and HoldBuckets are the histograms' upper bounds in
	// seconds. Nil means DefaultWaitBuckets and DefaultHoldBuckets.
	WaitBuckets, HoldBuckets []float64
}

// Collector is a prometheus.Collector for one bulkhead.Gate. It is safe
// for concurrent use.
type Collector struct {
	gate   atomic.Pointer[bulkhead.Gate]
	member atomic.Pointer[fleet.Member]

	global budgetDescs // the gate's global budget
	wl     budgetDescs // each workload's, with a workload label
	// the gate's server connections
	open, idle, dials, dialErrors, bad, unknown, dryRun *prometheus.Desc
	// Policy.Adaptive: the signal read at the last move of B
	lastMove *prometheus.Desc
	// the gate's fleet, if any
	fleetTotal, fleetInstances, fleetShare, fleetOrphans, fleetDegraded, fleetRounds, fleetFailures *prometheus.Desc

	wait  *prometheus.HistogramVec
	hold  *prometheus.HistogramVec
	moves *prometheus.CounterVec
	// waitNone, holdTx, holdExec and holdQuery are the histograms'
	// children for untagged operations, looked up once.
	waitNone                    prometheus.Observer
	holdTx, holdExec, holdQuery prometheus.Observer
}

// budgetDescs are the metrics of one budget, global or of a workload.
type budgetDescs struct {
	running, waiting, maxConc, maxQueue, maxWait             *prometheus.Desc
	admitted, rejections, connectFailed, canceled, wouldWait *prometheus.Desc
}

func newBudgetDescs(desc func(name, help string, labels ...string) *prometheus.Desc, prefix string, labels ...string) budgetDescs {
	d := func(name, help string, more ...string) *prometheus.Desc {
		return desc(prefix+name, help, append(labels[:len(labels):len(labels)], more...)...)
	}
	return budgetDescs{
		running:       d("running", "Operations holding an execution permit."),
		waiting:       d("waiting", "Admitted operations waiting for an execution permit."),
		maxConc:       d("max_concurrent", "Execution permits (B): operations that may run at once."),
		maxQueue:      d("max_queue", "Admission permits beyond max_concurrent (Q): operations that may wait for an execution permit."),
		maxWait:       d("max_queue_wait_seconds", "Longest an admitted operation waits for an execution permit before it is rejected."),
		admitted:      d("admitted_total", "Operations that got their permits and a server connection, and ran."),
		rejections:    d("rejections_total", "Operations rejected, by reason: admission_full (refused at once), queue_timeout (no execution permit within the queue wait), would_miss_deadline (it could not have finished within its context's deadline) or lease_expired (a fleet lease ran out and its fallback share had no room); in a dry run, those that would have been.", "reason"),
		connectFailed: d("connect_failed_total", "Operations that had their permits but whose server connection could not be dialed."),
		canceled:      d("canceled_total", "Operations whose context ended, or whose gate closed, before they ran."),
		wouldWait:     d("would_wait_total", "Dry run: operations that found no execution permit free and ran anyway."),
	}
}

func (b *budgetDescs) all() []*prometheus.Desc {
	return []*prometheus.Desc{b.running, b.waiting, b.maxConc, b.maxQueue, b.maxWait, b.admitted, b.rejections, b.connectFailed, b.canceled, b.wouldWait}
}

// collect sends s as b's metrics, with the given label values first.
func (b *budgetDescs) collect(ch chan<- prometheus.Metric, s bulkhead.Stats, labels ...string) {
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, more ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append(labels[:len(labels):len(labels)], more...)...)
	}
	gauge(b.running, float64(s.Running))
	gauge(b.waiting, float64(s.Waiting))
	gauge(b.maxConc, float64(s.MaxConcurrent))
	gauge(b.maxQueue, float64(s.MaxQueue))
	gauge(b.maxWait, s.QueueWait.Seconds())
	counter(b.admitted, s.Admitted)
	counter(b.rejections, s.RejectedFull, "admission_full")
	counter(b.rejections, s.RejectedTimeout, "queue_timeout")
	counter(b.rejections, s.RejectedDeadline, "would_miss_deadline")
	counter(b.rejections, s.RejectedLease, "lease_expired")
	counter(b.connectFailed, s.ConnectFailed)
	counter(b.canceled, s.Canceled)
	counter(b.wouldWait, s.WouldWait)
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a Collector with no gate attached: until Attach, it collects
// the histograms alone.
func New(o Opts) *Collector {
	name := func(n string) string { return prometheus.BuildFQName(o.Namespace, "bulkhead", n) }
	desc := func(n, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name(n), help, labels, o.ConstLabels)
	}
	if o.WaitBuckets == nil {
		o.WaitBuckets = DefaultWaitBuckets
	}
	if o.HoldBuckets == nil {
		o.HoldBuckets = DefaultHoldBuckets
	}
	c := &Collector{
		global:     newBudgetDescs(desc, ""),
		wl:         newBudgetDescs(desc, "workload_", "workload"),
		open:       desc("open_connections", "Server connections open, or being dialed, by the gate."),
		idle:       desc("idle_connections", "Server connections idle in the gate."),
		dials:      desc("dials_total", "Server connections dialed, failed dials included."),
		dialErrors: desc("dial_errors_total", "Dials of a server connection that failed, whoever asked for them (operations, Ping, Prepare, Raw)."),
		unknown:    desc("unknown_workload_total", "Operations whose context names a workload the policy lacks: they pass the global budget alone."),
		bad:        desc("bad_connections_total", "Server connections closed because the driver found them bad when reset or given back."),
		dryRun:     desc("dry_run", "1 while the policy is a dry run: rejections are counted and reported, not made."),
		lastMove:   desc("adaptive_last_move_queued", "Policy.Adaptive: the operations waiting inside the database (B less the throughput in work) read at the last move of B, labelled with why it moved: slow start, queueing, room, climb, explore, undone or kept.", "why"),

		fleetTotal:     desc("fleet_max_concurrent", "T: the execution permits of the whole fleet (the policy's MaxConcurrent).", "fleet"),
		fleetInstances: desc("fleet_instances", "Members of the fleet alive at the last successful coordination round.", "fleet"),
		fleetShare:     desc("fleet_share", "This member's share of the fleet's execution permits.", "fleet"),
		fleetOrphans:   desc("fleet_orphans", "Busy server connections beyond their member's slots (a killed one's, or one's without coordination), at the last successful round: the shares leave room for them.", "fleet"),
		fleetDegraded:  desc("fleet_degraded", "1 while the fleet coordination fails: the share is at most the fallback.", "fleet"),
		fleetRounds:    desc("fleet_rounds_total", "Fleet coordination rounds.", "fleet"),
		fleetFailures:  desc("fleet_failures_total", "Fleet coordination rounds that failed.", "fleet"),

		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: o.Namespace, Subsystem: "bulkhead", Name: "queue_wait_seconds",
			Help:        "Time each admitted operation waited for its permits (0 when they were free), by workload (\"\" for none).",
			ConstLabels: o.ConstLabels, Buckets: o.WaitBuckets,
		}, []string{"workload"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: o.Namespace, Subsystem: "bulkhead", Name: "hold_seconds",
			Help:        "Time each operation held its permits, by kind: transaction (begin to commit or rollback), statement (autocommit exec), query (until its rows were closed); and by workload (\"\" for none).",
			ConstLabels: o.ConstLabels, Buckets: o.HoldBuckets,
		}, []string{"kind", "workload"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: o.Namespace, Subsystem: "bulkhead", Name: "adaptive_moves_total",
			Help: "Policy.Adaptive: moves of B in force, by why (fed by Events.OnLimit).", ConstLabels: o.ConstLabels,
		}, []string{"why"}),
	}
	c.waitNone = c.wait.WithLabelValues("")
	c.holdTx = c.hold.WithLabelValues(bulkhead.KindTx.String(), "")
	c.holdExec = c.hold.WithLabelValues(bulkhead.KindExec.String(), "")
	c.holdQuery = c.hold.WithLabelValues(bulkhead.KindQuery.String(), "")
	return c
}

// Events returns the callbacks that feed the histograms: pass them to
// bulkhead.New with bulkhead.WithEvents (joined with others by
// bulkhead.JoinEvents if needed). Each observes one histogram; for an
// untagged operation they allocate nothing.
func (c *Collector) Events() bulkhead.Events {
	return bulkhead.Events{
		OnAdmit:   func(e bulkhead.Event) { c.waitObserver(e.Workload).Observe(e.Waited.Seconds()) },
		OnRelease: func(e bulkhead.Event) { c.holdObserver(e.Kind, e.Workload).Observe(e.Held.Seconds()) },
		OnLimit:   func(m bulkhead.Move) { c.moves.WithLabelValues(m.Why).Inc() },
	}
}

func (c *Collector) waitObserver(workload string) prometheus.Observer {
	if workload == "" {
		return c.waitNone
	}
	return c.wait.WithLabelValues(workload)
}

func (c *Collector) holdObserver(k bulkhead.Kind, workload string) prometheus.Observer {
	if workload == "" {
		switch k {
		case bulkhead.KindTx:
			return c.holdTx
		case bulkhead.KindExec:
			return c.holdExec
		case bulkhead.KindQuery:
			return c.holdQuery
		}
	}
	return c.hold.WithLabelValues(k.String(), workload)
}

// Attach makes c collect g's Stats. Call it once g is made with c's
// Events; a later call replaces the gate.
func (c *Collector) Attach(g *bulkhead.Gate) { c.gate.Store(g) }

// AttachFleet makes c collect the fleet member m's Stats too (attach its
// gate, m.Gate(), with Attach); a later call replaces the member.
func (c *Collector) AttachFleet(m *fleet.Member) { c.member.Store(m) }

// Describe sends the descriptors of every metric c may collect.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.global.all() {
		ch <- d
	}
	for _, d := range c.wl.all() {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{c.open, c.idle, c.dials, c.dialErrors, c.bad, c.unknown, c.dryRun,
		c.fleetTotal, c.fleetInstances, c.fleetShare, c.fleetOrphans, c.fleetDegraded, c.fleetRounds, c.fleetFailures} {
		ch <- d
	}
	ch <- c.lastMove
	c.wait.Describe(ch)
	c.hold.Describe(ch)
	c.moves.Describe(ch)
}

// Collect sends the gate's Stats and those of each workload of its
// policy, read now, and the histograms.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if g := c.gate.Load(); g != nil {
		s := g.Stats()
		c.global.collect(ch, s)
		ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, float64(s.OpenConns))
		ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, float64(s.IdleConns))
		ch <- prometheus.MustNewConstMetric(c.dials, prometheus.CounterValue, float64(s.Dials))
		ch <- prometheus.MustNewConstMetric(c.dialErrors, prometheus.CounterValue, float64(s.DialErrors))
		ch <- prometheus.MustNewConstMetric(c.bad, prometheus.CounterValue, float64(s.BadConns))
		ch <- prometheus.MustNewConstMetric(c.unknown, prometheus.CounterValue, float64(s.UnknownWorkload))
		if m := s.LastMove; m.Why != "" {
			ch <- prometheus.MustNewConstMetric(c.lastMove, prometheus.GaugeValue, m.Queued, m.Why)
		}
		dry := 0.0
		if s.DryRun {
			dry = 1
		}
		ch <- prometheus.MustNewConstMetric(c.dryRun, prometheus.GaugeValue, dry)
		if m := c.member.Load(); m != nil {
			f := m.Stats()
			degraded := 0.0
			if f.Degraded {
				degraded = 1
			}
			ch <- prometheus.MustNewConstMetric(c.fleetTotal, prometheus.GaugeValue, float64(f.Total), f.Name)
			ch <- prometheus.MustNewConstMetric(c.fleetInstances, prometheus.GaugeValue, float64(f.Instances), f.Name)
			ch <- prometheus.MustNewConstMetric(c.fleetShare, prometheus.GaugeValue, float64(f.Share), f.Name)
			ch <- prometheus.MustNewConstMetric(c.fleetOrphans, prometheus.GaugeValue, float64(f.Orphans), f.Name)
			ch <- prometheus.MustNewConstMetric(c.fleetDegraded, prometheus.GaugeValue, degraded, f.Name)
			ch <- prometheus.MustNewConstMetric(c.fleetRounds, prometheus.CounterValue, float64(f.Rounds), f.Name)
			ch <- prometheus.MustNewConstMetric(c.fleetFailures, prometheus.CounterValue, float64(f.Failures), f.Name)
		}
		for name := range g.Policy().Workloads {
			if ws, ok := g.WorkloadStats(name); ok {
				c.wl.collect(ch, ws, name)
			}
		}
	}
	c.wait.Collect(ch)
	c.hold.Collect(ch)
	c.moves.Collect(ch)
}
