package main

import (
	"fmt"
	"io"
	"strings"
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
