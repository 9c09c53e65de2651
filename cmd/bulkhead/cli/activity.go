package cli

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// ActivityDB reads, on a PostgreSQL connection of its own, how many
// transactions and connections one application_name has on the server:
// the monitors of load, overload and fleet.
type ActivityDB struct {
	db  *sql.DB
	app string
}

// activityQuery counts the transactions (those that began before this
// statement did: pg_stat_activity is not an atomic snapshot) and the
// connections of an application_name, leaving out pgx's ping, which a
// Ping runs without a permit.
const activityQuery = `SELECT count(*) FILTER (WHERE xact_start < statement_timestamp()
	    AND NOT (state = 'active' AND query = '-- ping')), count(*)
	FROM pg_stat_activity
	WHERE application_name = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`

// OpenActivityDB connects to t for watching app.
func OpenActivityDB(ctx context.Context, t *Target, app string) (*ActivityDB, error) {
	db := sql.OpenDB(t.PlainConnector("bulkhead-monitor"))
	db.SetMaxOpenConns(1)
	ctx, cancel := context.WithTimeout(ctx, 2*ConnectTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("monitor connection to %s: %w", t.Display, err)
	}
	return &ActivityDB{db: db, app: app}, nil
}

// Count reads the application's transactions and connections now.
func (a *ActivityDB) Count() (tx, conns int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = a.db.QueryRowContext(ctx, activityQuery, a.app).Scan(&tx, &conns)
	return tx, conns, err
}

// Drain waits, at most limit, looking every every, until the server shows
// no connection of the application left: work cancelled by the client may
// still be running there and would load what is measured next. It reports
// whether it saw none left.
func (a *ActivityDB) Drain(limit, every time.Duration) bool {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		_, conns, err := a.Count()
		if err != nil || conns == 0 {
			return err == nil
		}
		<-tick.C
	}
	return false
}

// Terminate ends the server sessions the application has left.
func (a *ActivityDB) Terminate() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*ConnectTimeout)
	defer cancel()
	_, err := a.db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	WHERE application_name = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`, a.app)
	return err
}

// Close closes the connection.
func (a *ActivityDB) Close() { a.db.Close() }

// Poller reads a's counts every every on a goroutine of its own, and hands
// each reading, with the time it was taken at, to see, until stop.
type Poller struct {
	*ActivityDB
	quit, done chan struct{}
}

// Poll starts polling.
func (a *ActivityDB) Poll(every time.Duration, see func(at time.Time, tx, conns int, err error)) *Poller {
	p := &Poller{ActivityDB: a, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			at := time.Now()
			tx, conns, err := a.Count()
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

// Stop ends the polling: no reading is handed over after it returns.
func (p *Poller) Stop() {
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	<-p.done
}

// Close stops the polling and closes the connection.
func (p *Poller) Close() {
	p.Stop()
	p.ActivityDB.Close()
}
