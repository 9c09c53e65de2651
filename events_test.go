//go:build go1.25

package bulkhead_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

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
	db := fkOpen(t, nil, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond}).db
	tx := testkit.Begin(t, t.Context(), db)
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
