// Command results reads the go test -json output that tests/outside/run
// collects and says what it shows.
//
//	results remaining -list LIST JSON...
//
// prints, one a line, the tests of LIST (the output of go test -list)
// that none of the JSON files ran to an end: neither passed, failed,
// skipped, nor started and left unfinished by a crash of the test binary.
// run uses it to resume a suite after a crash.
//
//	results report DIR
//
// reads DIR/SUITE/ARM/ (list.txt, run*.json, times.txt, build.log),
// prints a table of counts per suite and arm and, for every arm, the tests
// whose result differs from the plain arm's with the first lines of their
// output, and writes every test's result to DIR/results.tsv and the output
// of every test that did not pass to DIR/failures.txt.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// result is what one arm did with one top-level test.
type result struct {
	status  string // pass, fail, skip, crash (started, never ended: the binary died), notrun
	attempt int    // which run*.json (1 is the first; later ones resumed after a crash)
	elapsed float64
	output  []string          // the test's and its subtests' output, in order
	subFail []string          // failed subtests
	sub     map[string]string // subtest -> status
	paused  bool              // t.Parallel paused it and it never went on
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "remaining":
		err = remaining(os.Args[2:])
	case "report":
		if len(os.Args) != 3 {
			usage()
		}
		err = report(os.Args[2], os.Stdout)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "results:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: results remaining -list LIST JSON... | results report DIR")
	os.Exit(2)
}

func remaining(args []string) error {
	if len(args) < 2 || args[0] != "-list" {
		usage()
	}
	names, err := readList(args[1])
	if err != nil {
		return err
	}
	res, err := readRuns(args[2:])
	if err != nil {
		return err
	}
	for _, n := range names {
		if r, ok := res[n]; !ok || r.status == "notrun" {
			fmt.Println(n)
		}
	}
	return nil
}

// readList returns the tests go test runs of a go test -list output:
// tests, fuzz targets (their seed corpus) and examples, not benchmarks.
func readList(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "Test") || strings.HasPrefix(l, "Fuzz") || strings.HasPrefix(l, "Example") {
			names = append(names, l)
		}
	}
	return names, nil
}

// readRuns merges the attempts of one arm, in order: a test keeps the
// first result it got (a resumed attempt runs only what earlier ones did
// not reach).
func readRuns(files []string) (map[string]*result, error) {
	all := map[string]*result{}
	for i, f := range files {
		res, err := readRun(f, i+1)
		if err != nil {
			return nil, err
		}
		for n, r := range res {
			if _, ok := all[n]; !ok {
				all[n] = r
			}
		}
	}
	return all, nil
}

func readRun(path string, attempt int) (map[string]*result, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	res := map[string]*result{}
	get := func(top string) *result {
		r := res[top]
		if r == nil {
			r = &result{status: "crash", attempt: attempt, sub: map[string]string{}}
			res[top] = r
		}
		return r
	}
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		top, sub, _ := strings.Cut(e.Test, "/")
		r := get(top)
		switch e.Action {
		case "output":
			r.output = append(r.output, strings.TrimRight(e.Output, "\n"))
		case "pause", "cont":
			if sub == "" {
				r.paused = e.Action == "pause"
			}
		case "pass", "fail", "skip":
			if sub == "" {
				r.status = e.Action
				r.elapsed = e.Elapsed
			} else {
				r.sub[sub] = e.Action
				if e.Action == "fail" {
					r.subFail = append(r.subFail, sub)
				}
			}
		}
	}
	for n, r := range res {
		if r.status == "crash" && r.paused {
			delete(res, n) // never ran: the binary died while it waited
		}
	}
	return res, sc.Err()
}

// keyLines returns the first n lines of out worth reading: without
// go test's framing (=== RUN, --- PASS, ...), testify's error traces and
// blank lines.
func keyLines(out []string, n int) []string {
	var keep []string
	for _, l := range out {
		t := strings.TrimSpace(l)
		switch {
		case t == "",
			strings.HasPrefix(t, "Error Trace:"), // testify: the path, twice
			strings.HasPrefix(t, "Test:"),
			strings.HasPrefix(t, "/") && strings.Contains(t, ".go:"), // a trace's further frames
			strings.HasPrefix(t, "=== "),
			strings.HasPrefix(t, "--- PASS"),
			strings.HasPrefix(t, "--- FAIL"),
			strings.HasPrefix(t, "--- SKIP"):
			continue
		}
		if len(t) > 220 {
			t = t[:220] + "..."
		}
		keep = append(keep, t)
		if len(keep) == n {
			break
		}
	}
	return keep
}

// arm is one suite run one way.
type arm struct {
	suite, name string
	names       []string // go test -list
	res         map[string]*result
	attempts    int
	times       map[string]float64 // build, run1, run2, ...
	buildLog    []string
}

func loadArm(dir, suite, name string) (*arm, error) {
	a := &arm{suite: suite, name: name, times: map[string]float64{}}
	d := filepath.Join(dir, suite, name)
	if b, err := os.ReadFile(filepath.Join(d, "build.log")); err == nil && len(b) > 0 {
		a.buildLog = strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	if _, err := os.Stat(filepath.Join(d, "list.txt")); err == nil {
		names, err := readList(filepath.Join(d, "list.txt"))
		if err != nil {
			return nil, err
		}
		a.names = names
	}
	runs, _ := filepath.Glob(filepath.Join(d, "run*.json"))
	sort.Slice(runs, func(i, j int) bool { return runNum(runs[i]) < runNum(runs[j]) })
	a.attempts = len(runs)
	res, err := readRuns(runs)
	if err != nil {
		return nil, err
	}
	a.res = res
	for _, n := range a.names {
		if _, ok := res[n]; !ok {
			res[n] = &result{status: "notrun", sub: map[string]string{}}
		}
	}
	if b, err := os.ReadFile(filepath.Join(d, "times.txt")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) == 2 {
				if v, err := strconv.ParseFloat(f[1], 64); err == nil {
					a.times[f[0]] += v
				}
			}
		}
	}
	return a, nil
}

func runNum(path string) int {
	s := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "run"), ".json")
	n, _ := strconv.Atoi(s)
	return n
}

func (a *arm) count(status string) int {
	n := 0
	for _, r := range a.res {
		if r.status == status {
			n++
		}
	}
	return n
}

func (a *arm) sortedNames() []string {
	var names []string
	for n := range a.res {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (a *arm) runTime() float64 {
	t := 0.0
	for k, v := range a.times {
		if strings.HasPrefix(k, "run") {
			t += v
		}
	}
	return t
}

func report(dir string, w io.Writer) error {
	suites, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var arms [][]*arm // per suite, plain first
	for _, s := range suites {
		if !s.IsDir() {
			continue
		}
		order, _ := os.ReadFile(filepath.Join(dir, s.Name(), "arms.txt"))
		var sa []*arm
		for _, name := range strings.Fields(string(order)) {
			if _, err := os.Stat(filepath.Join(dir, s.Name(), name)); err != nil {
				continue
			}
			a, err := loadArm(dir, s.Name(), name)
			if err != nil {
				return err
			}
			sa = append(sa, a)
		}
		if len(sa) > 0 {
			arms = append(arms, sa)
		}
	}

	fmt.Fprintf(w, "%-6s %-9s %5s %5s %5s %6s %7s %6s %9s %8s %9s\n",
		"suite", "arm", "pass", "fail", "skip", "crash", "not-run", "total", "attempts", "build_s", "test_s")
	for _, sa := range arms {
		for _, a := range sa {
			fmt.Fprintf(w, "%-6s %-9s %5d %5d %5d %6d %7d %6d %9d %8.1f %9.1f\n",
				a.suite, a.name, a.count("pass"), a.count("fail"), a.count("skip"), a.count("crash"),
				a.count("notrun"), len(a.res), a.attempts, a.times["build"], a.runTime())
		}
	}
	fmt.Fprintln(w, "(crash: the test started and the test binary died before it ended, a panic or the timeout; the run resumed with the tests not reached. build_s: go test -list, which builds; test_s: the go test -json runs)")

	for _, sa := range arms {
		for _, a := range sa {
			if len(a.buildLog) > 0 && len(a.names) == 0 {
				fmt.Fprintf(w, "\n%s %s: BUILD FAILED:\n", a.suite, a.name)
				for _, l := range head(a.buildLog, 15) {
					fmt.Fprintf(w, "    %s\n", l)
				}
			}
		}
		plain := sa[0]
		if plain.name != "plain" {
			continue
		}
		for _, a := range sa[1:] {
			var diff []string
			for _, n := range unionNames(plain, a) {
				if status(plain, n) != status(a, n) {
					diff = append(diff, n)
				}
			}
			fmt.Fprintf(w, "\n%s %s: %d tests differ from plain\n", a.suite, a.name, len(diff))
			for _, n := range diff {
				r := a.res[n]
				fmt.Fprintf(w, "  %s: plain %s, %s %s", n, status(plain, n), a.name, status(a, n))
				if r != nil && r.attempt > 1 {
					fmt.Fprintf(w, " (in resumed run %d)", r.attempt)
				}
				fmt.Fprintln(w)
				if r == nil {
					continue
				}
				if len(r.subFail) > 0 {
					fmt.Fprintf(w, "      failed subtests: %s\n", strings.Join(r.subFail, ", "))
				}
				if r.status != "pass" {
					for _, l := range keyLines(r.output, 8) {
						fmt.Fprintf(w, "      | %s\n", l)
					}
				}
			}
		}
	}
	if err := writeTSV(filepath.Join(dir, "results.tsv"), arms); err != nil {
		return err
	}
	return writeFailures(filepath.Join(dir, "failures.txt"), arms)
}

func status(a *arm, name string) string {
	if r, ok := a.res[name]; ok {
		return r.status
	}
	return "absent"
}

func unionNames(a, b *arm) []string {
	seen := map[string]bool{}
	var names []string
	for _, x := range []*arm{a, b} {
		for n := range x.res {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	return names
}

func head(l []string, n int) []string {
	if len(l) > n {
		return l[:n]
	}
	return l
}

func writeTSV(path string, arms [][]*arm) error {
	// One block per suite, three columns per arm.
	var b strings.Builder
	for _, sa := range arms {
		fmt.Fprintf(&b, "suite\ttest")
		for _, a := range sa {
			fmt.Fprintf(&b, "\t%s\t%s_s\t%s_failed_subtests", a.name, a.name, a.name)
		}
		b.WriteString("\n")
		seen := map[string]bool{}
		var names []string
		for _, a := range sa {
			for _, n := range a.sortedNames() {
				if !seen[n] {
					seen[n] = true
					names = append(names, n)
				}
			}
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(&b, "%s\t%s", sa[0].suite, n)
			for _, a := range sa {
				r := a.res[n]
				if r == nil {
					b.WriteString("\tabsent\t\t")
					continue
				}
				fmt.Fprintf(&b, "\t%s\t%.2f\t%s", r.status, r.elapsed, strings.Join(r.subFail, " "))
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func writeFailures(path string, arms [][]*arm) error {
	var b strings.Builder
	for _, sa := range arms {
		for _, a := range sa {
			for _, n := range a.sortedNames() {
				r := a.res[n]
				if r.status == "pass" {
					continue
				}
				fmt.Fprintf(&b, "==== %s %s %s: %s (run %d)\n", a.suite, a.name, n, r.status, r.attempt)
				for _, l := range r.output {
					fmt.Fprintf(&b, "%s\n", l)
				}
				b.WriteString("\n")
			}
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
