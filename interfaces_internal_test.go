package bulkhead

import (
	"database/sql/driver"
	"io"
)

// The driver interfaces the gate's types implement, checked at compile time.
var (
	_ driver.Conn                           = (*conn)(nil)
	_ driver.ConnBeginTx                    = (*conn)(nil)
	_ driver.ConnPrepareContext             = (*conn)(nil)
	_ driver.ExecerContext                  = (*conn)(nil)
	_ driver.QueryerContext                 = (*conn)(nil)
	_ driver.Execer                         = (*conn)(nil) //lint:ignore SA1019 offered for Raw callers that assert it
	_ driver.Queryer                        = (*conn)(nil) //lint:ignore SA1019 offered for Raw callers that assert it
	_ driver.Pinger                         = (*conn)(nil)
	_ driver.SessionResetter                = (*conn)(nil)
	_ driver.Validator                      = (*conn)(nil)
	_ driver.NamedValueChecker              = (*conn)(nil)
	_ driver.Rows                           = (*rows)(nil)
	_ driver.RowsNextResultSet              = (*rows)(nil)
	_ driver.RowsColumnTypeScanType         = (*rows)(nil)
	_ driver.RowsColumnTypeDatabaseTypeName = (*rows)(nil)
	_ driver.RowsColumnTypeLength           = (*rows)(nil)
	_ driver.RowsColumnTypeNullable         = (*rows)(nil)
	_ driver.RowsColumnTypePrecisionScale   = (*rows)(nil)
	_ driver.Stmt                           = (*stmt)(nil)
	_ driver.StmtExecContext                = (*stmt)(nil)
	_ driver.StmtQueryContext               = (*stmt)(nil)
	_ driver.NamedValueChecker              = (*stmt)(nil)
	_ driver.Connector                      = (*Gate)(nil)
	_ io.Closer                             = (*Gate)(nil)
	_ driver.DriverContext                  = gateDriver{}
)
