package stdlib_test

// The gate arm of tests/outside/run: every *sql.DB the suite opens is
// sql.OpenDB(bulkhead.Connector(pgx's connector, gatePolicy)), gatePolicy
// from zz_outside_policy_test.go (testdata/policy_test.go).

import (
	"context"
	"database/sql"
	"database/sql/driver"

	"github.com/dbbulkhead/bulkhead"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// stdlib.OpenDB(cfg, opts...) is sql.OpenDB(stdlib.GetConnector(cfg, opts...)).
func gateOpenDB(cfg pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
	return sql.OpenDB(bulkhead.Connector(stdlib.GetConnector(cfg, opts...), gatePolicy))
}

// stdlib.OpenDBFromPool is sql.OpenDB(stdlib.GetPoolConnector(pool, opts...))
// with SetMaxIdleConns(0).
func gateOpenDBFromPool(pool *pgxpool.Pool, opts ...stdlib.OptionOpenDB) *sql.DB {
	db := sql.OpenDB(bulkhead.Connector(stdlib.GetPoolConnector(pool, opts...), gatePolicy))
	db.SetMaxIdleConns(0)
	return db
}

// sql.Open(driverName, dsn) is sql.OpenDB of the driver's connector for
// dsn (database/sql does exactly that for a driver.DriverContext, as
// pgx's driver is; its connector also reads stdlib.RegisterConnConfig's
// names).
func gateSQLOpen(driverName, dsn string) (*sql.DB, error) {
	c, err := gateDriverConnector(driverName, dsn)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(bulkhead.Connector(c, gatePolicy)), nil
}

func gateSQLOpenDB(c driver.Connector) *sql.DB {
	return sql.OpenDB(bulkhead.Connector(c, gatePolicy))
}

func gateRegisterConnConfig(c *pgx.ConnConfig) string { return stdlib.RegisterConnConfig(c) }

func gateUnregisterConnConfig(connStr string) { stdlib.UnregisterConnConfig(connStr) }

// gateDriverConnector returns the connector sql.Open(driverName, dsn)
// would use, with sql.Open's errors (an unknown driver name, a DSN the
// driver refuses).
func gateDriverConnector(driverName, dsn string) (driver.Connector, error) {
	probe, err := sql.Open(driverName, dsn) // connects to nothing
	if err != nil {
		return nil, err
	}
	d := probe.Driver()
	probe.Close()
	if dc, ok := d.(driver.DriverContext); ok {
		return dc.OpenConnector(dsn)
	}
	return gateDSNConnector{d, dsn}, nil
}

type gateDSNConnector struct {
	d   driver.Driver
	dsn string
}

func (c gateDSNConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c gateDSNConnector) Driver() driver.Driver                        { return c.d }
