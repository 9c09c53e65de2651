package bulkhead

import (
	"context"
	"database/sql/driver"
)

// tx is the open transaction of a conn. It holds both permits from a
// successful BeginTx until the driver's Commit or Rollback returns, on
// whatever goroutine calls it (database/sql rolls back from its own
// goroutine when the transaction's context ends).
type tx struct {
	c     *conn
	inner driver.Tx
	ctx   context.Context // BeginTx's
	p     permit
	held  bool // p is to be released
}

var _ driver.Tx = (*tx)(nil)

func (t *tx) Commit() error {
	defer t.end()
	_, err := guarded(t.c, func() (struct{}, error) { return struct{}{}, t.inner.Commit() })
	return ctxErr(t.ctx, err)
}

// Rollback rolls back in the driver. After the transaction's context
// ended (database/sql's own rollback, usually), the session is then
// closed unless the driver can reset and validate it: database/sql's rule
// for its own pool (see conn.go).
func (t *tx) Rollback() error {
	if s := t.c.sess; s != nil && !s.keepOnRollback && t.ctx.Err() != nil {
		s.discard = true
	}
	defer t.end()
	_, err := guarded(t.c, func() (struct{}, error) { return struct{}{}, t.inner.Rollback() })
	return ctxErr(t.ctx, err)
}

// end releases the transaction's permits, once.
func (t *tx) end() {
	if t.held {
		t.held = false
		t.c.g.release(&t.p)
	}
}
