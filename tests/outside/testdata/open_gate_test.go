package outside // tests/outside/run sets the suite's package here

// The gate arm's helpers common to every suite: sql.Open and sql.OpenDB
// become sql.OpenDB(bulkhead.Connector(the driver's connector, gatePolicy)).
// A suite's own helpers of the arm are in SUITE/open_gate_test.go.

import (
	"context"
	"database/sql"
	"database/sql/driver"

	"github.com/dbbulkhead/bulkhead"
)

// sql.Open(driverName, dsn) is sql.OpenDB of the driver's connector for
// dsn (database/sql does exactly that for a driver.DriverContext: pgx's
// connector also reads stdlib.RegisterConnConfig's names, the MySQL
// driver's is NewConnector(ParseDSN(dsn))).
func gateSQLOpen(driverName, dsn string) (*sql.DB, error) {
	c, err := gateDriverConnector(driverName, dsn)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(bulkhead.Connector(c, gatePolicy)), nil
}

// sql.OpenDB(c), with c from the driver or a test's own connector.
func gateSQLOpenDB(c driver.Connector) *sql.DB {
	return sql.OpenDB(bulkhead.Connector(c, gatePolicy))
}

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
