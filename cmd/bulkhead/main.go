// Command bulkhead demonstrates and measures the bulkhead gate, and checks
// a PostgreSQL connection budget.
//
//	bulkhead demo     the gate rejects the overload, the held transaction commits
//	bulkhead load     N clients against the gate (and, with --baseline, without it)
//	bulkhead overload open-loop arrivals at 1, 3, 6 × capacity: plain pool, pool as semaphore, gate
//	bulkhead budget   instances × connections + other ≤ max_connections − reserved
//	bulkhead policy   the policy that BULKHEAD_* in the environment gives
//
// Exit status: 0 ok, 1 a finding (budget: over budget), 2 an error (usage,
// input, unreachable server).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/term"
)

// Exit codes.
const (
	exitOK      = 0
	exitFinding = 1
	exitError   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first Ctrl-C the commands stop and report; a second
		// one ends the process the usual way.
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command: args without the program name, the process
// environment, output on stdout and stderr; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr, lookup: os.LookupEnv, isTerminal: isTerminal}
	return e.run(ctx, args)
}

// env is what a command sees of the outside world; tests give their own.
type env struct {
	stdout, stderr io.Writer
	lookup         func(string) (string, bool)
	isTerminal     func(io.Writer) bool
}

const topUsage = `bulkhead: a database/sql gate that caps database work (B), queues a little (Q), rejects the rest.

Usage:
  bulkhead demo   [--dsn URL]      the demonstration: overload rejected, held transaction commits
  bulkhead load   [flags]          N clients through the gate (--baseline: also without it)
  bulkhead overload [flags]        open-loop arrivals at multiples of capacity: plain, semaphore, gate
  bulkhead budget --dsn URL ...    connection budget of a PostgreSQL server
  bulkhead policy                  the policy from BULKHEAD_* environment variables

Run "bulkhead COMMAND --help" for a command's flags and examples.

Environment:
  DATABASE_URL              the database when --dsn is not given (postgres://... or mysql://...)
  BULKHEAD_MAX_CONCURRENT   B, default 10
  BULKHEAD_MAX_QUEUE        Q, default 10
  BULKHEAD_QUEUE_WAIT       longest wait for a permit, default 100ms

Exit status: 0 ok, 1 a finding (over budget), 2 an error (usage, input, server).
`

func (e *env) run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, topUsage)
		return exitError
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "demo":
		return e.demo(ctx, rest)
	case "load":
		return e.load(ctx, rest)
	case "overload":
		return e.overload(ctx, rest)
	case "budget":
		return e.budget(ctx, rest)
	case "policy":
		return e.policy(ctx, rest)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(e.stdout, topUsage)
		return exitOK
	}
	return e.fail(fmt.Errorf("unknown command %q; want demo, load, overload, budget or policy (bulkhead --help)", cmd))
}

// fail prints err as one line on stderr, prefixed "bulkhead:" once, and
// returns the error exit code.
func (e *env) fail(err error) int {
	fmt.Fprintln(e.stderr, oneLine(err))
	return exitError
}

// oneLine renders err as a single line starting with "bulkhead: ", the
// prefix only once.
func oneLine(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	// Wrapped library errors carry the prefix too: keep it once, in front.
	return "bulkhead: " + strings.ReplaceAll(msg, "bulkhead: ", "")
}

// newFlagSet returns a flag set for a subcommand. Its errors are reported
// by parseFlags; --help prints usage (synopsis, flags, examples) on stdout.
func (e *env) newFlagSet(name, synopsis, examples string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		fmt.Fprintf(e.stdout, "%s\n\nFlags:\n", strings.TrimRight(synopsis, "\n"))
		if n == 0 {
			fmt.Fprintln(e.stdout, "  none but --help")
		}
		fs.SetOutput(e.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		fmt.Fprintf(e.stdout, "\nExamples:\n%s", examples)
	}
	return fs
}

// parseFlags parses args into fs. It returns done=true with the exit code
// when the command must stop: --help (0) or a bad flag (2, one line on
// stderr).
func (e *env) parseFlags(fs *flag.FlagSet, args []string) (code int, done bool) {
	usage := fs.Usage
	fs.Usage = func() {} // the flag package calls it on every error
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return exitOK, true
	}
	name := fs.Name()
	if err != nil {
		return e.fail(fmt.Errorf("%s: %v (see bulkhead %s --help)", name, err, name)), true
	}
	if fs.NArg() > 0 {
		return e.fail(fmt.Errorf("%s: unexpected argument %q; flags only (see bulkhead %s --help)", name, fs.Arg(0), name)), true
	}
	return exitOK, false
}

// flagsSet returns the names of the flags given on the command line.
func flagsSet(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// terminalWidth returns the width of the terminal w is, or 0.
func terminalWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	width, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return width
}
