//go:build go1.25

package bulkhead_test

// A fleet budget on the fake driver, which knows no pg_locks: every
// coordination round fails, which shows what an instance does then. The
// rounds themselves are checked in fleet_internal_test.go (an in-memory
// lock table) and, on PostgreSQL, in tests/fleet_test.go.

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/syncbuf"
)

func TestAFleetInstanceWhoseCoordinationFailsHasNoShareAndSaysSo(t *testing.T) {
	fc := fakedb.New()
	fc.Define("work", fakedb.ResultSet{})
	var mu sync.Mutex
	var events []bulkhead.FleetEvent
	var logs syncbuf.Buffer // the coordination loop logs from its goroutine
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ev := bulkhead.JoinEvents(bulkhead.Events{OnFleet: func(e bulkhead.FleetEvent) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}}, bulkhead.SlogEvents(logger))
	p := bulkhead.Policy{MaxConcurrent: 8, MaxQueue: 4, QueueWait: time.Second, Fleet: "orders"}
	g, err := bulkhead.New(fc, p, bulkhead.WithFleetInterval(time.Hour), bulkhead.WithEvents(ev))
	if err != nil {
		t.Fatal(err)
	}
	db := g.OpenDB()
	defer db.Close()
	err = g.SyncFleet(context.Background())
	if !errors.Is(err, bulkhead.ErrFleet) {
		t.Fatalf("SyncFleet on a server without pg_locks: %v, want ErrFleet", err)
	}
	s := g.Stats()
	if s.MaxConcurrent != 0 || s.MaxQueue != 0 || s.MaxConns != 0 {
		t.Fatalf("no share yet and a failed round: B=%d, Q=%d, MaxConns=%d, want 0, 0, 0", s.MaxConcurrent, s.MaxQueue, s.MaxConns)
	}
	f := s.Fleet
	if f.Name != "orders" || f.Total != 8 || !f.Degraded || f.Failures < 1 || f.Rounds < f.Failures || !errors.Is(f.LastError, bulkhead.ErrFleet) || f.Backend != 0 {
		t.Fatalf("fleet stats %+v, want orders, T=8, degraded, the error, no session", f)
	}
	if p := g.Policy(); p.MaxConcurrent != 8 || p.Fleet != "orders" {
		t.Fatalf("Policy() = %+v, want the policy set (the fleet's limits)", p)
	}
	// Without a share, operations are rejected at once, as when the
	// admission is full.
	_, err = db.ExecContext(context.Background(), "work")
	var rej *bulkhead.RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, bulkhead.ErrAdmissionFull) || rej.MaxConcurrent != 0 {
		t.Fatalf("an operation without a share: %v, want an admission-full rejection with B=0", err)
	}
	mu.Lock()
	if len(events) == 0 || !errors.Is(events[len(events)-1].Err, bulkhead.ErrFleet) || events[len(events)-1].Fleet != "orders" {
		t.Fatalf("fleet events %+v, want the failure last", events)
	}
	mu.Unlock()
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, `msg="bulkhead: fleet coordination failed"`) || !strings.Contains(out, "fleet=orders") {
		t.Fatalf("log: %s, want a WARN record of the failure", out)
	}
}

func TestAGatesFleetCannotChangeButItsOtherLimitsCan(t *testing.T) {
	p := bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 2, QueueWait: time.Second, Fleet: "a"}
	g, err := bulkhead.New(fakedb.New(), p, bulkhead.WithFleetInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer g.OpenDB().Close()
	for _, other := range []string{"b", ""} {
		q := p
		q.Fleet = other
		if err := g.SetPolicy(q); !errors.Is(err, bulkhead.ErrInvalidPolicy) || !strings.Contains(err.Error(), "a gate's fleet is set when it is made") {
			t.Fatalf("SetPolicy with Fleet %q: %v, want an invalid-policy error", other, err)
		}
	}
	q := p
	q.MaxConcurrent, q.QueueWait = 6, 2*time.Second
	if err := g.SetPolicy(q); err != nil {
		t.Fatal(err)
	}
	if s := g.Stats(); s.Fleet.Total != 6 || s.QueueWait != 2*time.Second {
		t.Fatalf("after SetPolicy: T=%d, wait %v; want 6, 2s", s.Fleet.Total, s.QueueWait)
	}
	// Outside a fleet, no fleet stats and SyncFleet does nothing.
	h, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.OpenDB().Close()
	if err := h.SyncFleet(context.Background()); err != nil || h.Stats().Fleet != (bulkhead.FleetStats{}) {
		t.Fatalf("no fleet: SyncFleet %v, stats %+v", err, h.Stats().Fleet)
	}
}

func TestFleetOptionsRejectBadValues(t *testing.T) {
	p := bulkhead.Policy{MaxConcurrent: 1, Fleet: "a"}
	for _, c := range []struct {
		opt  bulkhead.Option
		want string
	}{
		{bulkhead.WithFleetInterval(time.Millisecond), "WithFleetInterval(1ms), want at least 10ms"},
		{bulkhead.WithFleetFallback(-1), "WithFleetFallback(-1), want at least 0"},
		{bulkhead.WithFleetConnector(nil), "WithFleetConnector(nil), want a connector"},
	} {
		_, err := bulkhead.New(fakedb.New(), p, c.opt)
		if !errors.Is(err, bulkhead.ErrInvalidPolicy) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New with a bad option: %v, want %q", err, c.want)
		}
	}
}

func TestClosingAFleetGateStopsItsCoordination(t *testing.T) {
	g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 2, Fleet: "a"}, bulkhead.WithFleetInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Let the loop run a few rounds (all failing on the fake driver).
	awaitState(t, "three rounds", func() bool { return g.Stats().Fleet.Rounds >= 3 })
	if err := g.OpenDB().Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.SyncFleet(context.Background()); !errors.Is(err, bulkhead.ErrClosed) {
		t.Fatalf("SyncFleet after Close: %v, want ErrClosed", err)
	}
	// goleak (TestMain) checks that the loop ended.
}
