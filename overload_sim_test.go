//go:build go1.25

package bulkhead

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

// The promises of adaptive B and of the README's rule for B, Q and the
// queue wait, kept by callers arriving on their own (open loop, 100 ms
// deadlines) through database/sql at a fake database whose cores share
// their time among the operations running, in a synctest bubble: every
// configuration sees the same arrivals.

// psDB is a database of cores sharing their time among what runs
// (processor sharing): an Exec of "work D" needs D of one core's time,
// times scale; "wait W" first waits W without a core (round trips, I/O);
// "lock" runs it all holding the one lock (a hot row), in turn.
type psDB struct {
	cores int
	lock  chan struct{}
	mu    sync.Mutex
	scale float64
	ops   map[*psOp]struct{}
	last  time.Time
	next  *time.Timer
}

// psFactor keys an operation's work factor in its context: drawn with its
// arrival, the same for every configuration whatever the order it runs in.
type psFactor struct{}

type psOp struct {
	left float64 // core time still needed, in nanoseconds
	done chan struct{}
}

func (s *psDB) hook(ctx context.Context, op fakedb.Op, query string) error {
	if op != fakedb.OpExec {
		return nil
	}
	var work, wait time.Duration
	serial := false
	f := strings.Fields(query)
	for i := 0; i < len(f); i++ {
		switch {
		case f[i] == "lock":
			serial = true
		case i+1 < len(f) && (f[i] == "work" || f[i] == "wait"):
			d, err := time.ParseDuration(f[i+1])
			if err != nil {
				return err
			}
			if f[i] == "work" {
				work = d
			} else {
				wait = d
			}
			i++
		default:
			return nil
		}
	}
	factor := 1.0
	if f, ok := ctx.Value(psFactor{}).(float64); ok {
		factor = f
	}
	if serial {
		select {
		case s.lock <- struct{}{}:
			defer func() { <-s.lock }()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if wait > 0 {
		t := time.NewTimer(time.Duration(float64(wait) * factor))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if work == 0 {
		return nil
	}
	s.mu.Lock()
	s.advanceLocked()
	o := &psOp{left: float64(work) * s.scale * factor, done: make(chan struct{})}
	s.ops[o] = struct{}{}
	s.scheduleLocked()
	s.mu.Unlock()
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ops[o]; !ok {
		return nil // done as the context ended
	}
	s.advanceLocked()
	delete(s.ops, o)
	s.scheduleLocked()
	return ctx.Err()
}

// rateLocked is the share of a core each operation running gets.
func (s *psDB) rateLocked() float64 { return min(1, float64(s.cores)/float64(len(s.ops))) }

// advanceLocked takes the time since the last change off the work left,
// and ends the operations done.
func (s *psDB) advanceLocked() {
	now := time.Now()
	if len(s.ops) > 0 {
		ran := float64(now.Sub(s.last)) * s.rateLocked()
		for o := range s.ops {
			if o.left -= ran; o.left < 1 {
				close(o.done)
				delete(s.ops, o)
			}
		}
	}
	s.last = now
}

// scheduleLocked sets the timer to the next end of an operation.
func (s *psDB) scheduleLocked() {
	if s.next != nil {
		s.next.Stop()
		s.next = nil
	}
	if len(s.ops) == 0 {
		return
	}
	least := math.Inf(1)
	for o := range s.ops {
		least = min(least, o.left)
	}
	s.next = time.AfterFunc(time.Duration(math.Ceil(least/s.rateLocked())), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.advanceLocked()
		s.scheduleLocked()
	})
}

type psKind struct {
	work     time.Duration
	weight   float64
	deadline time.Duration // 0: psDeadline
	wait     time.Duration
	lock     bool
}

func (k psKind) query() string {
	q := "work " + k.work.String()
	if k.wait > 0 {
		q += " wait " + k.wait.String()
	}
	if k.lock {
		q += " lock"
	}
	return q
}

type psShape struct {
	name   string
	cores  int
	kinds  []psKind
	jitter float64
	// at 1 × C no static B serves 0.95 of the arrivals: none is asked to
	spread bool
	// outlier, if set, arrives once at outlierAt: a request like no other
	outlier *psKind
	// tx: each request runs in a transaction that begins as every other
	// does, so that its kinds are one class of work, as the experiments'
	// transactions are
	tx bool
}

// capacity is C as the experiments measure it: what as many callers as
// cores do back to back, one at a time when the work takes the lock.
func (sh psShape) capacity() float64 {
	var mean, all float64
	n := float64(sh.cores)
	for _, k := range sh.kinds {
		mean += (k.work + k.wait).Seconds() * k.weight
		all += k.weight
		if k.lock {
			n = 1
		}
	}
	return n / (mean / all)
}

const psDeadline = 100 * time.Millisecond

// psRule is the README's rule: QueueWait = D − 2·B/C, MaxQueue = max(B, ⌊C·QueueWait⌋).
func psRule(b int, c float64) Policy {
	wait := max(psDeadline-time.Duration(2*float64(b)/c*float64(time.Second)), 0).Round(time.Millisecond)
	if wait == 0 {
		return Policy{MaxConcurrent: b}
	}
	return Policy{MaxConcurrent: b, MaxQueue: max(b, int(math.Floor(c*wait.Seconds()))), QueueWait: wait}
}

func psAdaptive() Policy {
	return Policy{MaxConcurrent: 16, MaxQueue: 64, QueueWait: psDeadline, Adaptive: true}
}

type psShift struct {
	at    time.Duration
	times float64
}

type psRun struct {
	arrived, good int
	byCause       map[string]int
	step          time.Duration
	arrivedAt     []int // per step
	goodAt        []int // of those arriving in each step
	limits        []int // B in force at the end of each step
	moves         []string
	dials         []int64 // Stats().Dials at the end of each step
}

func (r psRun) goodput(from, to time.Duration) float64 {
	g := 0
	for i := int(from / r.step); i < int(to/r.step) && i < len(r.goodAt); i++ {
		g += r.goodAt[i]
	}
	return float64(g) / (to - from).Seconds()
}

// runPS sends the shape's requests at load × its capacity for length to a
// gate of policy p; at shift.at the work per request is multiplied by
// shift.times (none if 0).
func runPS(t *testing.T, sh psShape, p Policy, load float64, length time.Duration, shift psShift) psRun {
	var out psRun
	synctest.Test(t, func(t *testing.T) {
		db := &psDB{cores: sh.cores, lock: make(chan struct{}, 1), scale: 1, ops: map[*psOp]struct{}{}, last: time.Now()}
		g, sqldb, fc := dlGate(t, p)
		fc.SetHook(db.hook)
		rng := rand.New(rand.NewPCG(1+*psSeed, 2))
		var all float64
		for _, k := range sh.kinds {
			all += k.weight
		}
		rate := load * sh.capacity()
		out = psRun{byCause: map[string]int{}, step: 250 * time.Millisecond}
		n := int(length / out.step)
		out.arrivedAt, out.goodAt = make([]int, n), make([]int, n)
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := time.Now()
		outlierSent := false
		for {
			time.Sleep(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
			at := time.Since(start)
			if at >= length {
				break
			}
			if shift.times > 0 && at >= shift.at && db.scale == 1 {
				db.mu.Lock()
				db.scale = shift.times
				db.mu.Unlock()
			}
			pick, k := rng.Float64()*all, sh.kinds[0]
			for _, k = range sh.kinds {
				if pick -= k.weight; pick < 0 {
					break
				}
			}
			factor := math.Exp(sh.jitter*rng.NormFloat64() - sh.jitter*sh.jitter/2)
			if sh.outlier != nil && !outlierSent && at >= outlierAt {
				k, factor, outlierSent = *sh.outlier, 1, true
			}
			i := int(at / out.step)
			for len(out.limits) < i {
				out.limits = append(out.limits, g.Stats().MaxConcurrent)
				out.dials = append(out.dials, g.Stats().Dials)
				m := g.Stats().LastMove
				out.moves = append(out.moves, fmt.Sprintf("%d→%d %s q%.1f g%.2f", m.From, m.To, m.Why, m.Queued, m.Gain))
			}
			out.arrived++
			out.arrivedAt[i]++
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), psFactor{}, factor), cmp.Or(k.deadline, psDeadline))
				defer cancel()
				var err error
				if sh.tx {
					err = psTx(ctx, sqldb, k.query())
				} else {
					_, err = sqldb.ExecContext(ctx, k.query())
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					out.good++
					out.goodAt[i]++
				case errors.Is(err, ErrWouldMissDeadline):
					out.byCause["late"]++
				case errors.Is(err, ErrAdmissionFull):
					out.byCause["full"]++
				case errors.Is(err, ErrQueueTimeout):
					out.byCause["timeout"]++
				case errors.Is(err, context.DeadlineExceeded):
					out.byCause["cut off"]++
				default:
					t.Errorf("unexpected error: %v", err)
				}
			})
		}
		wg.Wait()
		sqldb.Close()
	})
	return out
}

const ms = time.Millisecond

// psTx runs query in a transaction, after a first statement the same for
// every kind, as the experiments' roundtrips transactions begin.
func psTx(ctx context.Context, db *sql.DB, query string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	for _, q := range []string{"wait 0s", query} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}

// The shapes of experiments' --shape, and log-normal holds.
var psShapes = []psShape{
	{name: "cpu", cores: 2, kinds: []psKind{{work: 6 * ms, weight: 1}, {work: 8 * ms, weight: 1}, {work: 10 * ms, weight: 1}}},
	// holds that vary, log-normal: about 1 in 12 twice the median (σ 0.5)
	// or 1 in 4 (σ 1)
	{name: "noisy", cores: 2, kinds: []psKind{{work: 8 * ms, weight: 1}}, jitter: 0.5},
	{name: "noisier", cores: 2, kinds: []psKind{{work: 8 * ms, weight: 1}}, jitter: 1, spread: true},
	// I/O-bound: nothing queues in the database
	{name: "sleep", cores: 2, kinds: []psKind{{wait: 10 * ms, weight: 1}}},
	// a tenth of the requests are reports given 30 times the time
	{name: "mix", cores: 2, kinds: []psKind{{work: 2 * ms, weight: 9}, {work: 60 * ms, weight: 1, deadline: 30 * psDeadline}}},
	// one request sleeps 2 s (1,000 × S at most, as experiments' default)
	{name: "outlier", cores: 2, kinds: []psKind{{work: 8 * ms, weight: 1}},
		outlier: &psKind{wait: 2 * time.Second, deadline: 2*time.Second + psDeadline}},
	// every request updates one row, which it holds to its end
	{name: "hotrow", cores: 2, kinds: []psKind{{work: 2500 * time.Microsecond, wait: ms / 2, weight: 1, lock: true}}},
	// transactions of round trips: holds that grow with B while
	// throughput still rises
	{name: "roundtrips", cores: 2, kinds: []psKind{
		{work: ms, wait: 3 * ms, weight: 1}, {work: 3 * ms / 2, wait: 5 * ms, weight: 1}, {work: ms / 2, wait: 2 * ms, weight: 1},
		{work: 2 * ms, wait: 6 * ms, weight: 1}, {work: 4 * ms / 5, wait: 3 * ms, weight: 1}}, tx: true},
}

// outlierAt is when an outlier arrives.
const outlierAt = psLength / 6

// psSeed shifts the arrivals and work factors every run of the sim draws:
// go test -run 'TestAdaptiveB|TestAfterTheWork' -ps.seed N . runs its
// promises on other draws (docs/design.md gives seeds 0 to 23).
var psSeed = flag.Uint64("ps.seed", 0, "the overload sim's seed")

// psLength is each run's length; it starts cold: adaptive B at its floor.
const psLength = 3 * time.Second

// Adaptive B gets at least nine tenths of the best static B's goodput,
// from a cold start within a second on work whose holds do not vary (on
// holds that do, the first second got 0.89 of it: a window's goodput
// needs more completions there); at the database's capacity the
// README's rule (B its cores) and adaptive B serve nineteen twentieths of
// the arrivals (docs/design.md). Goodput: requests done within their
// deadlines.
func TestAdaptiveBGetsNineTenthsOfTheBestStaticBWithCallersDeadlines(t *testing.T) {
	for _, sh := range psShapes {
		for _, load := range []float64{1, 3, 6} {
			t.Run(fmt.Sprintf("%s/%g×C", sh.name, load), func(t *testing.T) {
				c := sh.capacity()
				best, bestB, byB := 0.0, 0, map[int]psRun{}
				for _, b := range []int{1, 2, 4, 8, 16} {
					r := runPS(t, sh, psRule(b, c), load, psLength, psShift{})
					byB[b] = r
					if g := r.goodput(0, psLength); g > best {
						best, bestB = g, b
					}
				}
				a := runPS(t, sh, psAdaptive(), load, psLength, psShift{})
				if g := a.goodput(0, psLength); g < 0.9*best {
					t.Errorf("adaptive: %.0f/s (%v), %.2f of the best static B's (%d: %.0f/s)", g, a.byCause, g/best, bestB, best)
				}
				if g := a.goodput(0, time.Second); g < 0.9*best && sh.jitter == 0 {
					t.Errorf("adaptive from a cold start: %.0f/s in the first second, %.2f of the best static B's", g, g/best)
				}
				t.Logf("adaptive %.2f of the best static B's goodput (B=%d), %.2f in the first second; %d of %d arrivals %v; the rule's B: %d %v",
					a.goodput(0, psLength)/best, bestB, a.goodput(0, time.Second)/best, a.good, a.arrived, a.byCause, byB[sh.cores].good, byB[sh.cores].byCause)
				for _, b := range []int{1, 2, 4, 8, 16} {
					t.Logf("static %d: %.0f/s %v", b, byB[b].goodput(0, psLength), byB[b].byCause)
				}
				t.Logf("adaptive B %v %v", a.limits, a.moves)
				if load != 1 || sh.spread {
					return
				}
				for name, r := range map[string]psRun{"adaptive": a, fmt.Sprintf("the rule's B=%d", sh.cores): byB[sh.cores]} {
					if r.good < r.arrived*95/100 {
						t.Errorf("%s at capacity: %d of %d arrivals done in time (%v), want 0.95", name, r.good, r.arrived, r.byCause)
					}
				}
			})
		}
	}
}

// After the work doubles or triples mid-run, the gate gets at least 0.85
// of the new capacity within half a second, with B by the rule and
// adaptive (docs/design.md).
func TestAfterTheWorkDoublesOrTriplesTheGateGetsMostOfTheNewCapacity(t *testing.T) {
	sh := psShapes[0]
	c := sh.capacity()
	for _, times := range []float64{2, 3} {
		shift := psShift{at: time.Second, times: times}
		for _, load := range []float64{1, 3} {
			for name, p := range map[string]Policy{"adaptive": psAdaptive(), "the rule's": psRule(sh.cores, c)} {
				r := runPS(t, sh, p, load, psLength, shift)
				g, now := r.goodput(shift.at+time.Second/2, psLength), c/times
				t.Logf("×%g, %g×C, %s B: %.0f/s after the shift, %.2f of the new capacity %.0f/s", times, load, name, g, g/now, now)
				if g < 0.85*now {
					t.Errorf("×%g, %g×C, %s B: %.0f/s done in time after the shift, %.2f of the new capacity (%.0f/s); %v", times, load, name, g, g/now, now, r.byCause)
				}
			}
		}
	}
}

// After its warm-up, adaptive B keeps its server connections: at most one
// dial per 10 s in steady load and overload on each shape of the
// experiments (docs/design.md; on log-normal holds B wanders with the
// noise, and dials up to 4 times in 10 s: not asked).
func TestAdaptiveBKeepsItsSessionsAfterItsWarmUp(t *testing.T) {
	const warm, counted = 5 * time.Second, 10 * time.Second
	for _, sh := range psShapes {
		if sh.jitter > 0 {
			continue
		}
		for _, load := range []float64{1, 3, 6} {
			r := runPS(t, sh, psAdaptive(), load, warm+counted, psShift{})
			d := r.dials
			n := d[len(d)-1] - d[int(warm/r.step)-1]
			t.Logf("%s %g×C: %d dials in the %v after %v (%d before), B %v", sh.name, load, n, counted, warm, d[int(warm/r.step)-1], r.limits)
			if n > 1 {
				t.Errorf("%s %g×C: %d dials in the %v after the first %v, want at most 1", sh.name, load, n, counted, warm)
			}
		}
	}
}
