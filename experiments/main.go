// Command experiments runs the measurements behind the README's charts,
// against the bulkhead gate and what it is compared with:
//
//	go run ./experiments overload  open-loop arrivals at 1, 3, 6 × capacity: plain pool, pool as semaphore, wait-first bulkhead, gate
//	go run ./experiments fleet     several processes of one service against one budget T: static gates, a fleet budget, PgBouncer
//
// (make overload, make fleet). Exit status: 0 ok, 2 an error (usage,
// input, unreachable server), 130 interrupted by Ctrl-C (143 by SIGTERM)
// after printing what was measured.
package main

import (
	"context"
	"fmt"
	"runtime"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
)

func main() { cli.Main("experiments", commands, run) }

// env is what a command sees of the outside world (cli.Env), with the
// commands as its methods.
type env struct{ *cli.Env }

// numCPU is B's default for overload.
var numCPU = runtime.NumCPU

// commands are the experiments, the settings they do not use and their
// own defaults.
var commands = map[string]cli.Command{
	"overload": {
		Unused: map[string]string{
			cli.SetFleet:    cli.OneProcess,
			cli.SetAdaptive: "the adaptive configuration is the gate with Adaptive, beside the others (--configs adaptive, --ceiling)",
			cli.SetMinB:     "the adaptive configuration starts at 1",
		},
		Defaults: map[string]string{
			cli.SetB:    fmt.Sprintf("the number of CPUs, %d here", numCPU()),
			cli.SetQ:    "max(B, ⌊C·wait⌋), by the rule",
			cli.SetWait: "deadline − 2·B/C, by the rule",
		},
	},
	"fleet": {
		Unused: map[string]string{
			cli.SetDryRun:    "the experiment measures what each arm enforces",
			cli.SetWorkloads: "the experiment's requests are of one kind",
			cli.SetFleet:     "the experiment names the fleet of its fleet arm itself, one per run",
			cli.SetAdaptive:  "each arm's B is the one the experiment sets",
			cli.SetMinB:      "each arm's B is the one the experiment sets",
		},
		Defaults: map[string]string{
			cli.SetDSN:  "none: required",
			cli.SetB:    "8, T: the service's total",
			cli.SetQ:    "max(B, ⌊B/S·wait⌋) per gate, by the rule",
			cli.SetWait: "deadline − 2·S, by the rule",
		},
	},
}

const usageHead = `experiments: the measurements behind the README's charts, run from the repository's root as go run ./experiments COMMAND.

Usage:
  experiments overload [flags]       open-loop arrivals at multiples of capacity: plain, semaphore, waitfirst, gate
  experiments fleet --dsn URL ...    processes of one service sharing T: static gates, fleet budget, PgBouncer

Run "experiments COMMAND --help" for a command's flags and examples.

`

const usageTail = `
Every command reads a setting as the bulkhead tool does: its flag, else its
variable, else the default. A flag a command does not use is an error; a
BULKHEAD_* variable that no setting names is one too.

%s
Exit status: 0 ok, 2 an error (usage, input, server), 130 interrupted by
Ctrl-C (143 by SIGTERM), after printing what was measured.
`

func (e *env) usage() string {
	return usageHead + e.EnvHelp("") + fmt.Sprintf(usageTail, e.SettingsMatrix([]string{"overload", "fleet"}))
}

// run is the whole program: args without the program name.
func run(ctx context.Context, ce *cli.Env, args []string) int {
	e := &env{ce}
	if len(args) == 0 {
		fmt.Fprint(e.Stderr, e.usage())
		return cli.ExitError
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "overload":
		return e.overload(ctx, rest)
	case "fleet":
		return e.fleet(ctx, rest)
	case fleetMemberCmd:
		// Hidden: a member of "experiments fleet".
		return e.fleetMember(ctx, rest)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(e.Stdout, e.usage())
		return cli.ExitOK
	}
	return e.Fail(fmt.Errorf("unknown command %q; want overload or fleet (experiments --help)", cmd))
}
