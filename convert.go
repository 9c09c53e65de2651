package bulkhead

import (
	"context"
	"database/sql/driver"
	"fmt"
	"reflect"
)

// stmtExec runs a driver statement as database/sql would: its context
// form if it has one, else the legacy form after the checks database/sql
// makes.
func stmtExec(ctx context.Context, si driver.Stmt, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := si.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return si.Exec(dargs) //lint:ignore SA1019 the legacy driver has nothing else
}

func stmtQuery(ctx context.Context, si driver.Stmt, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := si.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return si.Query(dargs) //lint:ignore SA1019 the legacy driver has nothing else
}

// stmtArgs converts args for the statement si the way database/sql
// converts a caller's arguments for a statement (driverArgsConnLocked):
// each argument passes si's NamedValueChecker (or else the connection's,
// conn), which may hand it on (driver.ErrSkip) to si's ColumnConverter,
// which may hand it on to the default conversion, or drop it
// (driver.ErrRemoveArgument); then the count must match si.NumInput().
// It serves the driver.ErrSkip fallback, where database/sql would have
// prepared the statement and converted the caller's arguments for it: the
// gate has them only as database/sql converted them for the connection,
// and converting a driver.Value again gives the same value for every
// converter of the standard library, pgx and go-sql-driver/mysql.
func stmtArgs(si driver.Stmt, conn driver.NamedValueChecker, args []driver.NamedValue) ([]driver.NamedValue, error) {
	want := si.NumInput()
	nvc, ok := si.(driver.NamedValueChecker)
	if !ok {
		nvc = conn
	}
	cci, _ := si.(driver.ColumnConverter)
	out := make([]driver.NamedValue, 0, len(args))
	for _, a := range args {
		nv := driver.NamedValue{Name: a.Name, Ordinal: len(out) + 1, Value: a.Value}
		keep, err := convertArg(&nv, nvc, cci, want)
		if err != nil {
			return nil, fmt.Errorf("bulkhead: converting argument %d for the prepared statement: %w", a.Ordinal, err)
		}
		if keep {
			out = append(out, nv)
		}
	}
	if want != -1 && len(out) != want {
		return nil, fmt.Errorf("bulkhead: expected %d arguments, got %d", want, len(out))
	}
	return out, nil
}

// convertArg runs nv through the checkers in database/sql's order: the
// NamedValueChecker, then the ColumnConverter (when the checker said
// driver.ErrSkip, or when there is no checker), then the default
// conversion. keep is false for driver.ErrRemoveArgument.
func convertArg(nv *driver.NamedValue, nvc driver.NamedValueChecker, cci driver.ColumnConverter, want int) (keep bool, err error) {
	if nvc != nil {
		switch err := nvc.CheckNamedValue(nv); err {
		case nil:
			return true, nil
		case driver.ErrRemoveArgument:
			return false, nil
		case driver.ErrSkip:
		default:
			return false, err
		}
	}
	if cci != nil {
		switch err := columnConvert(nv, cci, want); err {
		case nil:
			return true, nil
		case driver.ErrRemoveArgument:
			return false, nil
		case driver.ErrSkip:
		default:
			return false, err
		}
	}
	v, err := driver.DefaultParameterConverter.ConvertValue(nv.Value)
	if err != nil {
		return false, err
	}
	nv.Value = v
	return true, nil
}

var valuerType = reflect.TypeFor[driver.Valuer]()

// columnConvert converts nv with the statement's converter for its
// column, after the value's own driver.Valuer, as database/sql does. An
// argument beyond the statement's count is left to the count check.
func columnConvert(nv *driver.NamedValue, cci driver.ColumnConverter, want int) error {
	i := nv.Ordinal - 1
	if want <= i {
		return nil
	}
	if vr, ok := nv.Value.(driver.Valuer); ok {
		if rv := reflect.ValueOf(vr); rv.Kind() == reflect.Pointer && rv.IsNil() && rv.Type().Elem().Implements(valuerType) {
			nv.Value = nil // a nil pointer to a value Valuer is NULL, as in database/sql
		} else {
			v, err := vr.Value()
			if err != nil {
				return err
			}
			if !driver.IsValue(v) {
				return fmt.Errorf("non-subset type %T returned from Value", v)
			}
			nv.Value = v
		}
	}
	arg := nv.Value
	v, err := cci.ColumnConverter(i).ConvertValue(arg)
	if err != nil {
		return err
	}
	if !driver.IsValue(v) {
		return fmt.Errorf("driver ColumnConverter error converted %T to unsupported type %T", arg, v)
	}
	nv.Value = v
	return nil
}
