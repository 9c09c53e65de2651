package mysql

// The passthru arm of tests/outside/run: the rewritten suite with helpers
// that do what the calls they replace did. It shows that the rewrite
// alone changes no result.

import (
	"database/sql"
	"database/sql/driver"
)

func gateSQLOpen(driverName, dsn string) (*sql.DB, error) { return sql.Open(driverName, dsn) }

func gateSQLOpenDB(c driver.Connector) *sql.DB { return sql.OpenDB(c) }
