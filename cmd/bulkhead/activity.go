package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// activityDB reads, on a PostgreSQL connection of its own, how many
// transactions and connections one application_name has on the server:
// the monitors of load, overload and fleet.
type activityDB struct {
	db  *sql.DB
	app string
}

// activityQuery counts the transactions (those that began before this
// statement did: pg_stat_activity is not an atomic snapshot, see
// main_test.go's monitor) and the connections of an application_name,
// leaving out pgx's session-reset ping, which runs without a permit.
const activityQuery = `SELECT count(*) FILTER (WHERE xact_start < statement_timestamp()
	    AND NOT (state = 'active' AND query = '-- ping')), count(*)
	FROM pg_stat_activity
	WHERE application_name = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`

// openActivityDB connects to t for watching app.
func openActivityDB(ctx context.Context, t *target, app string) (*activityDB, error) {
	db := sql.OpenDB(t.plainConnector("bulkhead-monitor"))
	db.SetMaxOpenConns(1)
	ctx, cancel := context.WithTimeout(ctx, 2*connectTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("monitor connection to %s: %w", t.display, err)
	}
	return &activityDB{db: db, app: app}, nil
}

// count reads the application's transactions and connections now.
func (a *activityDB) count() (tx, conns int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = a.db.QueryRowContext(ctx, activityQuery, a.app).Scan(&tx, &conns)
	return tx, conns, err
}

// drain waits, at most limit, looking every every, until the server shows
// no connection of the application left: work cancelled by the client may
// still be running there and would load what is measured next.
func (a *activityDB) drain(limit, every time.Duration) {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		_, conns, err := a.count()
		if err != nil || conns == 0 {
			return
		}
		<-tick.C
	}
}

func (a *activityDB) close() { a.db.Close() }

// poller reads a's counts every every on a goroutine of its own, and hands
// each reading, with the time it was taken at, to see, until stop.
type poller struct {
	*activityDB
	quit, done chan struct{}
}

func (a *activityDB) poll(every time.Duration, see func(at time.Time, tx, conns int, err error)) *poller {
	p := &poller{activityDB: a, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			at := time.Now()
			tx, conns, err := a.count()
			see(at, tx, conns, err)
			select {
			case <-p.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// stop ends the polling: no reading is handed over after it returns.
func (p *poller) stop() {
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	<-p.done
}

// close stops the polling and closes the connection.
func (p *poller) close() {
	p.stop()
	p.activityDB.close()
}
