package main

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
	"github.com/dbbulkhead/bulkhead/internal/gatetest"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// policy prints each setting and where it came from: its default, with
// the variable unset, or the variable's value.
func TestPolicyPrintsEachSettingAndWhereItCameFrom(t *testing.T) {
	for _, c := range []struct {
		name  string
		run   func(*testing.T, map[string]string, ...string) result
		vars  map[string]string
		cells []string
	}{
		{"defaults when nothing is set", runQuiet, nil, []string{
			"max concurrent (B) 10 default, BULKHEAD_MAX_CONCURRENT unset",
			"max queue (Q) 10 default, BULKHEAD_MAX_QUEUE unset",
			"queue wait 100ms default, BULKHEAD_QUEUE_WAIT unset",
			"dry run false default, BULKHEAD_DRY_RUN unset",
			"workloads none default, BULKHEAD_WORKLOADS unset",
			"adaptive false default, BULKHEAD_ADAPTIVE unset",
			"min concurrent none default, BULKHEAD_MIN_CONCURRENT unset: adaptive only",
			"connections per instance 10 B = 10: the operations running and the free server connections the gate keeps for them, + 1 per *sql.Conn kept open and per Ping, Prepare or Raw running at once",
		}},
		{"what the environment sets", runOK, map[string]string{cli.EnvMaxConcurrent: "4", cli.EnvQueueWait: "20ms"}, []string{
			"4 from BULKHEAD_MAX_CONCURRENT=4",
			"10 default, BULKHEAD_MAX_QUEUE unset",
			"20ms from BULKHEAD_QUEUE_WAIT=20ms",
			"connections per instance 4 B = 4:",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clitest.WantCells(t, c.run(t, c.vars, "policy").Stdout, c.cells...)
		})
	}
}

func TestPolicyReportsTheLibraryErrorNamingTheVariable(t *testing.T) {
	cases := map[string]map[string]string{
		cli.EnvMaxConcurrent: {cli.EnvMaxConcurrent: "0"},
		cli.EnvMaxQueue:      {cli.EnvMaxQueue: "+4"},
		cli.EnvQueueWait:     {cli.EnvQueueWait: "1e9"},
		cli.EnvAdaptive:      {cli.EnvAdaptive: "1"},
		cli.EnvMinConcurrent: {cli.EnvAdaptive: "true", cli.EnvMinConcurrent: "0x2"},
	}
	for name, vars := range cases {
		t.Run(name, func(t *testing.T) {
			r := runCmd(t, vars, "policy")
			clitest.WantOneLineError(t, r, "policy:", name, `"`+vars[name]+`"`, "want")
			if r.Stdout != "" {
				t.Errorf("stdout %q, want nothing", r.Stdout)
			}
		})
	}
}

func TestPolicyShowsTheFleetAndItsConnections(t *testing.T) {
	r := runQuiet(t, map[string]string{cli.EnvFleet: "orders", cli.EnvMaxConcurrent: "8"}, "policy", "--max-queue", "4")
	clitest.WantCells(t, r.Stdout,
		"fleet orders from BULKHEAD_FLEET=orders: B=8 and Q=4 are the whole fleet's",
		"connections per instance its share of T, + 2 the fleet's: T = 8 for operations in all, + 2 per instance: its coordination session and its anchor",
	)
	// A name the library refuses, from the variable or the flag.
	clitest.WantOneLineError(t, runCmd(t, map[string]string{cli.EnvFleet: "Orders!"}, "policy"), "policy:", `BULKHEAD_FLEET="Orders!"`, "--fleet overrides it")
	runOK(t, map[string]string{cli.EnvFleet: "Orders!"}, "policy", "--fleet", "orders") // the flag overrides the bad variable
}

// The connections per instance that policy prints are what a gate of the
// policy keeps open on the server: B transactions at once hold that many,
// and after a burst beyond B+Q through gate.OpenDB (database/sql keeping
// B+Q idle) no more are left, but the one a *sql.Conn kept open holds.
func TestPolicyCountsTheServerConnectionsAGateOfThePolicyKeeps(t *testing.T) {
	const b, q = 2, 4
	r := runCmd(t, nil, "policy", "--max-concurrent", strconv.Itoa(b), "--max-queue", strconv.Itoa(q))
	m := regexp.MustCompile(`(?m)^connections per instance +(\d+) `).FindStringSubmatch(r.Stdout)
	if r.Code != cli.ExitOK || m == nil {
		t.Fatalf("exit %d, stderr %q, no count of connections per instance:\n%s", r.Code, r.Stderr, r.Stdout)
	}
	printed, _ := strconv.Atoi(m[1])

	app := fmt.Sprintf("bulkhead_policy_conns_%d", os.Getpid())
	g, db := gatetest.Open(t, serverConnector(t, app), bulkhead.Policy{MaxConcurrent: b, MaxQueue: q, QueueWait: time.Second})
	ctl := openServer(t)
	ctx := t.Context()
	server := func() int {
		var n int
		if err := ctl.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	var txs []*sql.Tx
	for range b {
		tx := testkit.Begin(t, ctx, db)
		txs = append(txs, tx)
	}
	if n := server(); n != printed {
		t.Errorf("policy prints %d connections per instance; B=%d transactions at once hold %d", printed, b, n)
	}
	for _, tx := range txs {
		testkit.Commit(t, tx)
	}

	kept := testkit.Conn(t, ctx, db)
	defer kept.Close()
	testkit.Exec(t, ctx, kept, "SELECT 1")
	var wg sync.WaitGroup
	for range 3 * (b + q) {
		wg.Go(func() {
			for range 5 {
				tx, err := db.BeginTx(ctx, nil)
				if errors.Is(err, bulkhead.ErrRejected) {
					continue
				}
				if err == nil {
					_, err = tx.ExecContext(ctx, "SELECT pg_sleep(0.002)")
					err = errors.Join(err, tx.Commit())
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// The server lists a closed connection until its backend has exited.
	deadline := time.Now().Add(20 * time.Second)
	for server() > printed+1 || g.Stats().OpenConns > printed+1 {
		if time.Now().After(deadline) {
			t.Fatalf("after the burst: %d server connections, the gate %d open; want at most %d printed + 1 kept by the *sql.Conn", server(), g.Stats().OpenConns, printed)
		}
		runtime.Gosched()
	}
	t.Logf("after the burst: %d server connections, gate %+v", server(), g.Stats())
}
