package cli

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

func TestErrorsAreOneLineWithThePrefixOnce(t *testing.T) {
	err := fmt.Errorf("load: %w", errors.New("bulkhead: failed to connect:\n\t127.0.0.1:1: refused\n\t::1: refused"))
	got := OneLine(err)
	want := "bulkhead: load: failed to connect: 127.0.0.1:1: refused ::1: refused"
	if got != want {
		t.Fatalf("OneLine = %q, want %q", got, want)
	}
}

func TestMySQLURLBecomesTheDriverConfig(t *testing.T) {
	tg, err := ParseTarget("--dsn", "mysql://app:p%40ss@db.example:3307/shop?parseTime=true")
	if err != nil {
		t.Fatal(err)
	}
	c := tg.My
	if tg.Dialect != DialectMySQL || c.User != "app" || c.Passwd != "p@ss" || c.Net != "tcp" ||
		c.Addr != "db.example:3307" || c.DBName != "shop" || !c.ParseTime || c.Timeout != ConnectTimeout {
		t.Fatalf("config %+v", c)
	}
	tg, err = ParseTarget("--dsn", "mysql://root@127.0.0.1/test?timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	if tg.My.Addr != "127.0.0.1:3306" || tg.My.Timeout != 2*time.Second {
		t.Fatalf("default port or timeout: %+v", tg.My)
	}
}

func TestPostgresURLKeepsItsApplicationNameForTheDemo(t *testing.T) {
	tg, err := ParseTarget("--dsn", "postgresql://u@h:5433/db?application_name=mine")
	if err != nil {
		t.Fatal(err)
	}
	if tg.Dialect != DialectPostgres || tg.PG.Port != 5433 || tg.PG.ConnectTimeout != ConnectTimeout {
		t.Fatalf("config %+v", tg.PG)
	}
	if _, err := tg.Connector("bulkhead-demo", true); err != nil {
		t.Fatal(err)
	}
	if got := tg.PG.RuntimeParams["application_name"]; got != "mine" {
		t.Fatalf("the target's config was changed: application_name %q", got)
	}
}

func TestRedactHidesPasswords(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@h/db":       "postgres://u:xxxxx@h/db",
		"postgres://u:secret@h:bad/db":   "postgres://u:xxxxx@h:bad/db",
		"mysql://root@h:3306/db":         "mysql://root@h:3306/db",
		"postgres://u:s%zz@h/db":         "postgres://u:xxxxx@h/db",
		"mongodb://a:b@h/db?x=1":         "mongodb://a:xxxxx@h/db?x=1",
		"postgres://postgres@h/test?x=1": "postgres://postgres@h/test?x=1",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestClassifyTellsEveryOutcomeApart(t *testing.T) {
	live := context.Background()
	expired, cancel := context.WithDeadline(live, time.Unix(0, 0))
	defer cancel()
	stopped, stop := context.WithCancel(live)
	stop()
	full := &bulkhead.RejectedError{Cause: bulkhead.ErrAdmissionFull}
	timeout := &bulkhead.RejectedError{Cause: bulkhead.ErrQueueTimeout}
	late := &bulkhead.RejectedError{Cause: bulkhead.ErrWouldMissDeadline}
	cases := []struct {
		name          string
		err           error
		opCtx, runCtx context.Context
		want          Outcome
	}{
		{"success", nil, live, live, OutCompleted},
		{"success after the deadline", nil, expired, live, OutCompleted},
		{"admission full", fmt.Errorf("begin: %w", full), live, live, OutRejectedFull},
		{"queue timeout", timeout, live, live, OutRejectedTimeout},
		{"would miss its deadline", fmt.Errorf("begin: %w", late), live, live, OutRejectedDeadline},
		{"would miss its deadline, which then passed", late, expired, live, OutRejectedDeadline},
		{"rejected while stopping", full, stopped, stopped, OutRejectedFull},
		{"deadline error", fmt.Errorf("timeout: %w", context.DeadlineExceeded), live, live, OutDeadline},
		{"driver error after the deadline", errors.New("conn closed"), expired, live, OutDeadline},
		{"stopped", context.Canceled, stopped, stopped, OutInterrupted},
		{"other", errors.New("syntax error"), live, live, OutOther},
	}
	for _, c := range cases {
		if got := Classify(c.err, c.opCtx, c.runCtx); got != c.want {
			t.Errorf("%s: Classify = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestPercentilesAreNearestRank(t *testing.T) {
	if Percentiles(nil) != nil {
		t.Fatal("percentiles of nothing must be nil")
	}
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if got := *Percentiles(ds); got != (Pct{P50: 50, P95: 95, P99: 99}) {
		t.Fatalf("percentiles of 1..100 ms = %+v", got)
	}
	if got := *Percentiles([]time.Duration{7 * time.Millisecond}); got != (Pct{P50: 7, P95: 7, P99: 7}) {
		t.Fatalf("percentiles of one = %+v", got)
	}
	if ds[0] != 100*time.Millisecond {
		t.Fatal("percentiles sorted its argument in place")
	}
}
