package bulkhead

import (
	"context"
	"errors"
	"log/slog"
)

// SlogEvents returns Events that log the gate's decisions through logger:
// admissions and releases at slog.LevelDebug, rejections at
// slog.LevelWarn. A nil logger means slog.Default(), looked up at each
// event. Pass the result to WithEvents, alone or joined with other Events
// by JoinEvents:
//
//	g, err := bulkhead.New(inner, policy, bulkhead.WithEvents(bulkhead.SlogEvents(logger)))
//
// Each record's message says what happened: "bulkhead: admitted",
// "bulkhead: released", "bulkhead: rejected", or, under Policy.DryRun,
// "bulkhead: would reject (dry run)" for a rejection counted but not made.
// Its attributes are kind ("transaction", "statement" or "query"), workload (only when the operation names one), reason (on a
// rejection: "admission_full" or "queue_timeout"), waited, and held (on
// release). Records are built only when the logger is enabled at their
// level, so a logger above Debug costs one Enabled call per admission and
// release. The events carry no context: records are logged with
// context.Background().
func SlogEvents(logger *slog.Logger) Events {
	l := func() *slog.Logger {
		if logger != nil {
			return logger
		}
		return slog.Default()
	}
	ctx := context.Background()
	log := func(level slog.Level, msg string, e Event, attrs ...slog.Attr) {
		lg := l()
		if !lg.Enabled(ctx, level) {
			return
		}
		all := make([]slog.Attr, 0, 5)
		all = append(all, slog.String("kind", e.Kind.String()))
		if e.Workload != "" {
			all = append(all, slog.String("workload", e.Workload))
		}
		all = append(all, attrs...)
		lg.LogAttrs(ctx, level, msg, all...)
	}
	return Events{
		OnAdmit: func(e Event) {
			log(slog.LevelDebug, "bulkhead: admitted", e, slog.Duration("waited", e.Waited))
		},
		OnRelease: func(e Event) {
			log(slog.LevelDebug, "bulkhead: released", e, slog.Duration("waited", e.Waited), slog.Duration("held", e.Held))
		},
		OnReject: func(e Event) {
			msg := "bulkhead: rejected"
			if e.DryRun {
				msg = "bulkhead: would reject (dry run)"
			}
			log(slog.LevelWarn, msg, e, slog.String("reason", ReasonLabel(e.Reason)), slog.Duration("waited", e.Waited))
		},
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
	}
	return Events{OnAdmit: fanOut(admit), OnReject: fanOut(reject), OnRelease: fanOut(release)}
}

func fanOut(fs []func(Event)) func(Event) {
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	return func(e Event) {
		for _, f := range fs {
			f(e)
		}
	}
}
