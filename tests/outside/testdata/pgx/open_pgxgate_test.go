package stdlib_test

// The pgxgate arm of tests/outside/run: every *sql.DB the suite opens on a
// pgx.ConnConfig or a DSN is
// sql.OpenDB(bulkhead.Connector(pgxgate.Connector(cfg, opts...), gatePolicy)).
// The pool form (stdlib.OpenDBFromPool) has no pgxgate counterpart
// (pgxgate.Connector takes a ConnConfig): it goes through bulkhead.Connector
// around stdlib.GetPoolConnector, as in the gate arm.

import (
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/pgxgate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

func gateOpenDB(cfg pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
	return sql.OpenDB(bulkhead.Connector(pgxgate.Connector(&cfg, opts...), gatePolicy))
}

func gateOpenDBFromPool(pool *pgxpool.Pool, opts ...stdlib.OptionOpenDB) *sql.DB {
	db := sql.OpenDB(bulkhead.Connector(stdlib.GetPoolConnector(pool, opts...), gatePolicy))
	db.SetMaxIdleConns(0)
	return db
}

// gateSQLOpen opens what sql.Open(driverName, dsn) opens: the
// ConnConfig registered under dsn (stdlib.RegisterConnConfig, seen through
// gateRegisterConnConfig), else the parsed dsn.
func gateSQLOpen(driverName, dsn string) (*sql.DB, error) {
	probe, err := sql.Open(driverName, dsn) // connects to nothing; sql.Open's errors
	if err != nil {
		return nil, err
	}
	d := probe.Driver()
	probe.Close()
	if d != stdlib.GetDefaultDriver() {
		return nil, fmt.Errorf("tests/outside: driver %q is not pgx's", driverName)
	}
	gateRegistry.Lock()
	cfg := gateRegistry.m[dsn]
	gateRegistry.Unlock()
	if cfg == nil {
		if cfg, err = pgx.ParseConfig(dsn); err != nil {
			return nil, err
		}
	}
	return sql.OpenDB(bulkhead.Connector(pgxgate.Connector(cfg), gatePolicy)), nil
}

func gateSQLOpenDB(c driver.Connector) *sql.DB {
	return sql.OpenDB(bulkhead.Connector(c, gatePolicy))
}

var gateRegistry = struct {
	sync.Mutex
	m map[string]*pgx.ConnConfig
}{m: map[string]*pgx.ConnConfig{}}

func gateRegisterConnConfig(c *pgx.ConnConfig) string {
	s := stdlib.RegisterConnConfig(c)
	gateRegistry.Lock()
	gateRegistry.m[s] = c
	gateRegistry.Unlock()
	return s
}

func gateUnregisterConnConfig(connStr string) {
	stdlib.UnregisterConnConfig(connStr)
	gateRegistry.Lock()
	delete(gateRegistry.m, connStr)
	gateRegistry.Unlock()
}
