package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// printShapeLines prints a phase's lines of what its shape or --cold adds:
// requests by kind, the lock's release, the cold start.
func (rep *overloadReport) printShapeLines(w io.Writer, ph *overloadPhase) {
	head := fmt.Sprintf("%s×C %s:", fmtLoad(ph.Load), ph.Config)
	if len(rep.Kinds) > 1 && ph.ByKind != nil {
		var parts []string
		for _, k := range rep.Kinds {
			if c := ph.ByKind[k]; c != nil && c.Arrived > 0 {
				parts = append(parts, fmt.Sprintf("%s %d of %d", k, c.WithinDeadline, c.Arrived))
			}
		}
		fmt.Fprintf(w, "%s in time by kind: %s\n", head, strings.Join(parts, ", "))
	}
	if ph.LockReleaseMs != nil {
		line := fmt.Sprintf("%s table locked at %s ms, released at %.0f ms of the counted time", head, optMs(ph.LockAtMs), *ph.LockReleaseMs)
		if ph.GoodAfterRelease != nil {
			line += fmt.Sprintf("; goodput %.0f/s in the second after", *ph.GoodAfterRelease)
		}
		if ph.FirstAfterRelMs != nil {
			line += fmt.Sprintf("; the first request arriving after it committed in time %.0f ms after the release", *ph.FirstAfterRelMs)
		} else {
			line += "; no request arriving after it committed in time"
		}
		fmt.Fprintln(w, line)
	}
	if ph.ColdFirstSPerS != nil {
		reach := "never"
		if ph.ColdReachMs != nil {
			reach = fmt.Sprintf("after %.0f ms", *ph.ColdReachMs)
		}
		fmt.Fprintf(w, "%s cold start: goodput %.0f/s in the first second; 0.9 of the counted %.0f/s %s\n", head, *ph.ColdFirstSPerS, ph.GoodputPerS, reach)
	}
}

func optMs(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f", *v)
}

// summaryShape is one report's part of the summary: one shape at one S.
type summaryShape struct {
	label string
	loads []float64
	best  []int // per load, the best static B; 0: no static configuration ran
	rows  []summaryRow
}

// summaryRow is one configuration's line of a summaryShape; NaN where
// there is nothing to say.
type summaryRow struct {
	config  string
	vsBest  []float64 // per load, goodput ÷ the best static B's
	refused float64   // at 1×C: refused (full, timeout, late) ÷ arrived
	dials   []float64 // per load, dials per second of the counted time
}

// summarizeShapes returns, for each report, each configuration's goodput over
// the best static B's at each load (its median rounds'), its refusals at
// 1×C and its dials per second.
func summarizeShapes(reps []*overloadReport) []summaryShape {
	services := map[float64]bool{}
	for _, rep := range reps {
		services[rep.ServiceTargetMs] = true
	}
	var out []summaryShape
	for _, rep := range reps {
		if len(rep.Phases) == 0 {
			continue
		}
		sh := summaryShape{label: rep.Shape}
		if len(services) > 1 {
			sh.label += fmt.Sprintf(" S≈%gms", rep.ServiceTargetMs)
		}
		var configs []string
		for _, ph := range rep.Phases {
			if !slices.Contains(sh.loads, ph.Load) {
				sh.loads = append(sh.loads, ph.Load)
			}
			if !slices.Contains(configs, ph.Config) {
				configs = append(configs, ph.Config)
			}
		}
		bests := make([]*overloadPhase, len(sh.loads))
		for i, load := range sh.loads {
			var at []*overloadPhase
			for _, ph := range rep.Phases {
				if ph.Load == load {
					at = append(at, ph)
				}
			}
			bests[i] = bestOf(at)
			b := 0
			if bests[i] != nil {
				b, _ = staticB(bests[i].Config)
			}
			sh.best = append(sh.best, b)
		}
		for _, c := range configs {
			row := summaryRow{config: c, refused: math.NaN()}
			for i, load := range sh.loads {
				ph, vs, d := rep.phase(load, c), math.NaN(), math.NaN()
				if ph != nil {
					d = ph.DialsPerS
					if best := bests[i]; best != nil && best.GoodputPerS > 0 {
						vs = ph.GoodputPerS / best.GoodputPerS
					}
					if load == 1 && ph.Arrived > 0 {
						row.refused = float64(ph.RejectedFull+ph.RejectedTimeout+ph.RejectedDeadline) / float64(ph.Arrived)
					}
				}
				row.vsBest, row.dials = append(row.vsBest, vs), append(row.dials, d)
			}
			sh.rows = append(sh.rows, row)
		}
		out = append(out, sh)
	}
	return out
}

// printSummary prints the shape × configuration summary of reps, in one
// table headed by the first shape's loads (a run's shapes share them).
func printSummary(w io.Writer, reps []*overloadReport) {
	shapes := summarizeShapes(reps)
	if len(shapes) == 0 {
		return
	}
	fmt.Fprintln(w, "\nsummary, shape × configuration: goodput ÷ the best static B's at each load; refused at 1×C (full, timeout, late) in % of arrivals; dials per second at each load")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "shape\tconfig\t"
	for _, l := range shapes[0].loads {
		head += fmtLoad(l) + "×C\t"
	}
	fmt.Fprintln(tw, head+"refused 1×C\tdials/s\t")
	for _, sh := range shapes {
		best := sh.label + "\tbest static B\t"
		for _, b := range sh.best {
			if b == 0 {
				best += "-\t"
			} else {
				best += fmt.Sprintf("%d\t", b)
			}
		}
		fmt.Fprintln(tw, best+"\t\t")
		for _, r := range sh.rows {
			line := sh.label + "\t" + r.config + "\t"
			for _, v := range r.vsBest {
				line += fmtNaN(v, "%.2f") + "\t"
			}
			var dials []string
			for _, d := range r.dials {
				dials = append(dials, fmtNaN(d, "%.1f"))
			}
			fmt.Fprintf(tw, "%s%s\t%s\t\n", line, fmtNaN(100*r.refused, "%.1f%%"), strings.Join(dials, " / "))
		}
	}
	tw.Flush()
}

// fmtNaN formats v, or "-" for NaN.
func fmtNaN(v float64, format string) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf(format, v)
}
