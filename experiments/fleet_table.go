package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
)

// The fleet experiment's table: one row per arm and phase, then the
// comparisons the issue asks for.

// fmtSeconds formats a length of time in seconds for the table.
func fmtSeconds(s float64) string {
	return strconv.FormatFloat(s, 'f', 2, 64) + " s"
}

// members describes the live members of a phase: "4", or "4→8→4" when
// it changed: as it began, at most, as it ended.
func (p *fleetPhase) members() string {
	parts := []string{strconv.Itoa(p.MembersFirst)}
	if p.MembersMax > p.MembersFirst && p.MembersMax > p.MembersLast {
		parts = append(parts, strconv.Itoa(p.MembersMax))
	}
	if last := strconv.Itoa(p.MembersLast); last != parts[len(parts)-1] {
		parts = append(parts, last)
	}
	return strings.Join(parts, "→")
}

func (p *fleetPhase) rejected() int64 { return p.RejectedFull + p.RejectedTimeout }

// settle is the phase's settle cell: the slowest event's time to settle,
// "> x s" if one did not within x (the time to the next event), "-"
// outside the fleet arm.
func (p *fleetPhase) settle(a *fleetArm) string {
	if a.Name != armFleet {
		return "-"
	}
	if p.Unsettled > 0 {
		longest := 0.0
		for _, ev := range a.Events {
			if ev.Phase == p.Name && ev.SettleS == nil {
				longest = max(longest, ev.WithinS)
			}
		}
		return "> " + fmtSeconds(longest)
	}
	if p.SettleMaxS == nil {
		return "-"
	}
	return fmtSeconds(*p.SettleMaxS)
}

func (rep *fleetReport) printTable(w io.Writer) {
	db := rep.Database
	if f := strings.Fields(rep.ServerVersion); len(f) > 0 {
		db += " (PostgreSQL " + f[0] + ")"
	}
	fmt.Fprintf(w, "\nfleet on %s, %d CPUs shared by the members, the server and this command\n", db, rep.CPUs)
	capacity := float64(rep.Total) / (rep.ServiceMs / 1000)
	fmt.Fprintf(w, "T = %d; each request BEGIN; SELECT pg_sleep(%g ms); COMMIT with a deadline of %g ms; T/S = %.0f/s; offered %g × T/S = %.0f/s in all (Poisson), split evenly over the live members\n",
		rep.Total, rep.ServiceMs, rep.DeadlineMs, capacity, rep.Load, rep.RatePerS)
	rule := ""
	if rep.Rule {
		rule = " (by the rule: wait = D − 2·S, Q = max(B, ⌊B/S·wait⌋))"
	}
	fmt.Fprintf(w, "gates wait %g ms%s; phases: start %gs, steady %gs, deploy %d × %gs, kill %gs, scale-down %gs; N = %d members\n",
		rep.QueueWaitMs, rule, rep.WarmupS, rep.PhaseS, rep.Members+1, rep.PhaseS, rep.PhaseS, rep.PhaseS, rep.Members)
	for _, a := range rep.Arms {
		fmt.Fprintf(w, "  %-10s %s\n", a.Name, a.Setup)
	}
	fmt.Fprintln(w)
	if !rep.measured() {
		fmt.Fprintln(w, "nothing measured: interrupted")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "arm\tphase\tmembers\toffered/s\tgoodput/s\tok p99\tfail p99\tsucceeded\trejected\tdeadline\tlate\tother\tsrv tx\tsrv conns\tsettle\tround fails\t")
	p99 := func(x *cli.Pct) string {
		if x == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f", x.P99)
	}
	for _, a := range rep.Arms {
		for _, p := range a.Phases {
			fails := "-"
			if a.Name == armFleet {
				fails = strconv.Itoa(p.RoundFailures)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%.0f\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n",
				a.Name, p.Name, p.members(), p.OfferedPerS, p.GoodputPerS, p99(p.SuccessMs), p99(p.FailureMs),
				p.Succeeded, p.rejected(), p.DeadlineExceeded, p.Late, p.Other, intOr(p.ServerMaxTx), intOr(p.ServerMaxConns), p.settle(a), fails)
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "(ms; ok = committed within the deadline; fail p99 = the time any failure took to come back: a rejection, the deadline, a late commit;")
	fmt.Fprintln(w, " srv tx, srv conns = the most transactions and sessions of the service on the server at one poll (behind PgBouncer, its server sessions);")
	fmt.Fprintln(w, " fleet arm: settle = the slowest of the phase's events,")
	fmt.Fprintln(w, " round fails = coordination rounds that failed, each lowering that member's share to the fallback without a slot behind it)")
	fmt.Fprintln(w)
	rep.printComparisons(w)
	for _, a := range rep.Arms {
		for _, p := range a.Phases {
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range p.ErrorSamples {
					if !yield(k) {
						return
					}
				}
			})
			for _, k := range keys {
				fmt.Fprintf(w, "%s %s: other error ×%d: %s\n", a.Name, p.Name, p.ErrorSamples[k], k)
			}
		}
		for _, e := range a.Errors {
			fmt.Fprintf(w, "%s: %s\n", a.Name, e)
		}
		if a.PollError != "" {
			fmt.Fprintf(w, "%s: pg_stat_activity poller stopped: %s\n", a.Name, a.PollError)
		}
	}
	if rep.Interrupted {
		fmt.Fprintln(w, "interrupted: the results above are those measured before")
	}
}

// comparedPhases are the phases compared with the baseline's steady
// goodput: those whose offered load and live members match it.
var comparedPhases = []string{phaseSteady, phaseDeploy, phaseKill, phaseScaleDown}

// printComparisons prints the figures the issue asks for: goodput against
// one process holding B = T, the phases above T, the fleet's settle
// times.
func (rep *fleetReport) printComparisons(w io.Writer) {
	one := rep.arm(armOne).phase(phaseSteady)
	if one != nil && one.GoodputPerS > 0 {
		fmt.Fprintf(w, "goodput against one process holding B = T at the same offered load (%.0f/s: goodput %.0f/s):\n", rep.RatePerS, one.GoodputPerS)
		for _, ph := range comparedPhases {
			var parts []string
			for _, a := range rep.Arms {
				if p := a.phase(ph); p != nil && a.Name != armOne {
					parts = append(parts, fmt.Sprintf("%s %s", a.Name, ratio(p.GoodputPerS, one.GoodputPerS)))
				}
			}
			if len(parts) > 0 {
				fmt.Fprintf(w, "  %-11s %s\n", ph, strings.Join(parts, ", "))
			}
		}
	}
	var over, within []string
	for _, a := range rep.Arms {
		above := false
		for _, p := range a.Phases {
			if p.ServerMaxTx != nil && *p.ServerMaxTx > rep.Total {
				over = append(over, fmt.Sprintf("%s %s %d (+%d)", a.Name, p.Name, *p.ServerMaxTx, *p.ServerMaxTx-rep.Total))
				above = true
			}
		}
		if !above {
			within = append(within, a.Name)
		}
	}
	if len(over) > 0 {
		fmt.Fprintf(w, "server transactions above T = %d: %s\n", rep.Total, strings.Join(over, "; "))
	}
	if len(within) > 0 {
		fmt.Fprintf(w, "server transactions within T = %d in every phase: %s\n", rep.Total, strings.Join(within, ", "))
	}
	if a := rep.arm(armFleet); a != nil && len(a.Events) > 0 {
		fmt.Fprintf(w, "fleet shares settled after each event (interval %gs; two intervals %gs):\n", rep.IntervalS, 2*rep.IntervalS)
		var line []string
		phase := ""
		flush := func() {
			if len(line) > 0 {
				fmt.Fprintf(w, "  %-11s %s\n", phase, strings.Join(line, "; "))
			}
			line = nil
		}
		for _, ev := range a.Events {
			if ev.Phase != phase {
				flush()
				phase = ev.Phase
			}
			s := "not within " + fmtSeconds(ev.WithinS)
			if ev.SettleS != nil {
				s = fmtSeconds(*ev.SettleS)
			}
			if ev.ReadyS != nil {
				s += " (processes ready after " + fmtSeconds(*ev.ReadyS) + ")"
			}
			line = append(line, fmt.Sprintf("%s %s → %d live: %s", ev.Kind, memberList(ev.Members), ev.Live, s))
		}
		flush()
	}
}

// memberList formats member indexes: "#4", "#0-3", "#0,#2".
func memberList(ms []int) string {
	if len(ms) == 0 {
		return "none"
	}
	contiguous := true
	for i := 1; i < len(ms); i++ {
		contiguous = contiguous && ms[i] == ms[i-1]+1
	}
	if len(ms) > 1 && contiguous {
		return fmt.Sprintf("#%d-%d", ms[0], ms[len(ms)-1])
	}
	var parts []string
	for _, m := range ms {
		parts = append(parts, "#"+strconv.Itoa(m))
	}
	return strings.Join(parts, ",")
}
