package promgate_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/promgate"
)

// The README's Prometheus snippet: the collector is made first, its
// events go to the gate, then the gate is attached and the collector
// registered.
func Example() {
	cfg, err := pgx.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	metrics := promgate.New(promgate.Opts{ConstLabels: prometheus.Labels{"db": "orders"}})
	g, err := bulkhead.New(stdlib.GetConnector(*cfg),
		bulkhead.Policy{MaxConcurrent: 16, MaxQueue: 32, QueueWait: 50 * time.Millisecond},
		bulkhead.WithEvents(metrics.Events()))
	if err != nil {
		log.Fatal(err)
	}
	metrics.Attach(g)
	prometheus.MustRegister(metrics)

	db := g.OpenDB()
	defer db.Close()
	http.Handle("/metrics", promhttp.Handler())
}

// A rejection as the collector reports it.
func ExampleCollector() {
	metrics := promgate.New(promgate.Opts{})
	g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 50 * time.Millisecond},
		bulkhead.WithEvents(metrics.Events()))
	if err != nil {
		log.Fatal(err)
	}
	metrics.Attach(g)
	db := g.OpenDB()
	defer db.Close()

	tx, _ := db.Begin()
	ctx := bulkhead.WithQueueWait(context.Background(), 0) // this operation waits for nobody
	_, err = db.ExecContext(ctx, "UPDATE stock SET qty = 0")
	fmt.Println(err)
	out, _ := testutil.CollectAndFormat(metrics, expfmt.TypeTextPlain, "bulkhead_running", "bulkhead_rejections_total")
	fmt.Print(string(out))
	tx.Rollback()
	// Output:
	// bulkhead: queue wait timed out after 0s: 1 running + 0 waiting of B=1, Q=1
	// # HELP bulkhead_rejections_total Operations rejected, by reason: admission_full (refused at once), queue_timeout (no execution permit within the queue wait), would_miss_deadline (it could not have finished within its context's deadline) or lease_expired (a fleet lease ran out and its fallback share had no room); in a dry run, those that would have been.
	// # TYPE bulkhead_rejections_total counter
	// bulkhead_rejections_total{reason="admission_full"} 0
	// bulkhead_rejections_total{reason="lease_expired"} 0
	// bulkhead_rejections_total{reason="queue_timeout"} 1
	// bulkhead_rejections_total{reason="would_miss_deadline"} 0
	// # HELP bulkhead_running Operations holding an execution permit.
	// # TYPE bulkhead_running gauge
	// bulkhead_running 1
}
