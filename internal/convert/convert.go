// Package convert converts a driver call's arguments as database/sql does
// before it calls the driver, for a gate that calls the driver later, on
// the server connection that runs the call.
package convert

import (
	"database/sql/driver"
	"fmt"
	"reflect"
)

// Args converts args in place as database/sql does
// (driverArgsConnLocked): si's NamedValueChecker, else nvc, then si's
// ColumnConverter, then the default; a statement's count must then match
// its NumInput. si is nil for a connection's Exec or Query.
func Args(args []driver.NamedValue, nvc driver.NamedValueChecker, si driver.Stmt) ([]driver.NamedValue, error) {
	want := -1
	var cci driver.ColumnConverter
	if si != nil {
		want = si.NumInput()
		if c, ok := si.(driver.NamedValueChecker); ok {
			nvc = c
		}
		cci, _ = si.(driver.ColumnConverter)
	}
	n := 0
	for _, nv := range args {
		nv.Ordinal = n + 1
		keep, err := convertArg(&nv, nvc, cci, want)
		if err != nil {
			name := fmt.Sprintf("$%d", nv.Ordinal)
			if nv.Name != "" {
				name = fmt.Sprintf("with name %q", nv.Name)
			}
			return nil, fmt.Errorf("bulkhead: converting argument %s type: %w", name, err)
		}
		if keep {
			args[n] = nv
			n++
		}
	}
	if want != -1 && n != want {
		return nil, fmt.Errorf("bulkhead: expected %d arguments, got %d", want, n)
	}
	return args[:n], nil
}

// convertArg runs nv through the checkers; keep is false to drop it.
func convertArg(nv *driver.NamedValue, nvc driver.NamedValueChecker, cci driver.ColumnConverter, want int) (keep bool, err error) {
	err = driver.ErrSkip
	if nvc != nil {
		err = nvc.CheckNamedValue(nv)
	}
	if err == driver.ErrSkip && cci != nil {
		err = columnConvert(nv, cci, want)
	}
	switch err {
	case nil:
		return true, nil
	case driver.ErrRemoveArgument:
		return false, nil
	case driver.ErrSkip:
	default:
		return false, err
	}
	v, err := driver.DefaultParameterConverter.ConvertValue(nv.Value)
	if err != nil {
		return false, err
	}
	nv.Value = v
	return true, nil
}

var valuerType = reflect.TypeFor[driver.Valuer]()

// columnConvert converts nv with its Valuer, then si's column converter;
// an argument beyond si's count is left to the count check.
func columnConvert(nv *driver.NamedValue, cci driver.ColumnConverter, want int) error {
	i := nv.Ordinal - 1
	if want >= 0 && want <= i {
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
