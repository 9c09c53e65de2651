package fleet

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// The coordination store: a member's membership and slot locks, on a
// session of their own; its statements are in sql.go.

// store is one coordination session: where the fleet's membership and
// slot locks live. pgStore is PostgreSQL's; the tests have an in-memory
// one.
type store interface {
	// join opens the session and takes the membership lock of id; it
	// returns the session's backend pid, which holds the slots it will
	// lock, or an error matching errIDTaken if another session holds
	// that membership lock. With reclaim, it also ends that session (the
	// member's own previous one): the next join finds the lock free.
	join(ctx context.Context, id int64, reclaim bool) (int64, error)
	// read returns the fleet: the members with the state each published
	// at its last round, which session holds each slot, and the orphans;
	// state is this member's, published for the others.
	read(ctx context.Context, state string) (view, error)
	// grow locks up to n free slots below t, without waiting for any, and
	// returns those it got: under the fleet's grow lock, it takes no more
	// than t minus the slots held and the orphans, as one reading finds
	// them. It takes none, without waiting, while another member holds
	// the grow lock.
	grow(ctx context.Context, t, n int) ([]int, error)
	// unlock frees slots and publishes state, the member's with its B
	// lowered, in the same statement.
	unlock(ctx context.Context, slots []int, state string) error
	// end ends the session pid of the member id, whose lease ran out,
	// and the idle server connections tagged with id, and reports whether
	// the session is gone: its locks are then free.
	end(ctx context.Context, pid, id int64) (bool, error)
	// leave ends the session, freeing its locks.
	leave()
}

// errIDTaken: another session holds the membership lock of the id.
var errIDTaken = errors.New("membership lock held by another session")

// pgStore keeps a fleet's locks as session-level advisory locks of one
// dedicated PostgreSQL session, keys (Members, id) and (Slots, index),
// read back from pg_locks with the connections' tags (Conns, id).
type pgStore struct {
	conn     driver.Connector
	keys     Keys
	interval time.Duration

	db     *sql.DB
	sess   *sql.Conn
	anchor *sql.Conn // holds (Anchors, id): it outlives sess if only sess is ended
}

func (p *pgStore) join(ctx context.Context, id int64, reclaim bool) (int64, error) {
	db := sql.OpenDB(noClose{p.conn})
	db.SetMaxIdleConns(1)
	sess, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return 0, err
	}
	var pid int64
	var ok bool
	// A grow's transaction left open by a member that stopped answering
	// (a pause, a network cut) would keep the others from growing until
	// the server ends the session: the server ends it after a round's
	// time instead, and the member's locks with it.
	idle := strconv.FormatInt(max(p.interval, 5*time.Second).Milliseconds(), 10)
	err = sess.QueryRowContext(ctx, sqlJoin, p.keys.Members, id, idle).Scan(&pid, &ok, new(string))
	if err == nil && !ok {
		err = fmt.Errorf("%w: (%d, %d)", errIDTaken, p.keys.Members, id)
		if reclaim {
			var ended int
			if rerr := sess.QueryRowContext(ctx, sqlReclaim, unsigned(p.keys.Members), id).Scan(&ended); rerr != nil {
				err = fmt.Errorf("%w; ending it: %w", err, rerr)
			} else {
				err = fmt.Errorf("%w: by this member's previous session, which the server had not ended; ended %d session(s), the next round joins", err, ended)
			}
		}
	}
	var anchor *sql.Conn
	if err == nil {
		anchor, err = db.Conn(ctx)
	}
	if err == nil {
		_, err = anchor.ExecContext(ctx, sqlLockShared, p.keys.Anchors, id)
		if err != nil {
			anchor.Close()
		}
	}
	if err != nil {
		sess.Close()
		db.Close()
		return 0, err
	}
	p.db, p.sess, p.anchor = db, sess, anchor
	return pid, nil
}

func (p *pgStore) leave() {
	// Unlock explicitly when the session still answers, so that the locks
	// are free before this returns, whatever database/sql then does with
	// the connection; closing it frees them anyway.
	ctx, cancel := context.WithTimeout(context.Background(), p.interval)
	_, _ = p.sess.ExecContext(ctx, sqlLeave)
	_, _ = p.anchor.ExecContext(ctx, sqlUnlockAll)
	cancel()
	p.sess.Close()
	p.anchor.Close()
	p.db.Close()
}

// read looks at pg_locks once; the same statement sets the session's
// application_name to state, which pg_stat_activity then shows.
func (p *pgStore) read(ctx context.Context, state string) (view, error) {
	return p.scan(ctx, p.sess, state)
}

// queryer is a session or a transaction on it.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// scan reads the fleet's locks from pg_locks in one statement, and, if
// state is not empty, publishes it as the session's application_name.
func (p *pgStore) scan(ctx context.Context, q queryer, state string) (view, error) {
	keys := []int64{unsigned(p.keys.Members), unsigned(p.keys.Slots), unsigned(p.keys.Conns), unsigned(p.keys.Anchors)}
	var rows *sql.Rows
	var err error
	if state == "" {
		rows, err = q.QueryContext(ctx, sqlRead, keys)
	} else {
		rows, err = q.QueryContext(ctx, sqlReadPublishing, keys, state)
	}
	if err != nil {
		return view{}, err
	}
	defer rows.Close()
	v := view{slots: map[int]int64{}, anchors: map[int64]bool{}}
	busy, unknown := map[int64]int{}, map[int64]int{}
	for rows.Next() {
		var class, obj, pid, idle int64
		var app, state string
		if err := rows.Scan(&class, &obj, &pid, &app, &state, &idle); err != nil {
			return view{}, err
		}
		switch class {
		case unsigned(p.keys.Members):
			v.members = append(v.members, member{id: obj, pid: pid, state: app, idle: time.Duration(idle) * time.Millisecond})
		case unsigned(p.keys.Slots):
			v.slots[int(obj)] = pid
		case unsigned(p.keys.Anchors):
			v.anchors[obj] = true
		default: // a tag; its state is empty when it cannot be seen
			switch state {
			case "idle":
			case "":
				unknown[obj]++
			default:
				busy[obj]++
			}
		}
	}
	if err := rows.Err(); err != nil {
		return view{}, err
	}
	slices.SortFunc(v.members, func(a, b member) int { return cmp.Compare(a.id, b.id) })
	v.orphans = orphans(v.members, v.slots, busy, unknown)
	v.fenced = fenced(v)
	return v, nil
}

// grow takes slots in a transaction that first takes the fleet's grow
// lock: two members growing at once would each see room for the same
// orphans. It does not wait for the lock: the round is then short of its
// target, and the next comes after half an interval.
func (p *pgStore) grow(ctx context.Context, t, n int) ([]int, error) {
	tx, err := p.sess.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	var mine bool
	if err := tx.QueryRowContext(ctx, sqlGrowLock, p.keys.Grow).Scan(&mine); err != nil || !mine {
		return nil, err
	}
	v, err := p.scan(ctx, tx, "")
	if err != nil {
		return nil, err
	}
	free := freeSlots(v, t, n)
	if len(free) == 0 {
		return nil, tx.Commit()
	}
	// Session-level locks taken in a transaction outlive it.
	rows, err := tx.QueryContext(ctx, sqlTake, p.keys.Slots, int32s(free))
	if err != nil {
		return nil, err
	}
	var got []int
	for rows.Next() {
		var s int
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return got, err
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		return got, err
	}
	return got, tx.Commit()
}

func (p *pgStore) unlock(ctx context.Context, slots []int, state string) error {
	if len(slots) == 0 {
		return nil
	}
	_, err := p.sess.ExecContext(ctx, sqlUnlock, p.keys.Slots, state, int32s(slots))
	return err
}

func (p *pgStore) end(ctx context.Context, pid, id int64) (bool, error) {
	var gone bool
	wait := min(p.interval, time.Second).Milliseconds()
	// Its anchor and idle connections go too: the anchor would fence the
	// fleet, and a statement the member sends on an idle connection when
	// it resumes then fails, unrun, and its retry meets the gate's check
	// of the lapsed lease.
	err := p.sess.QueryRowContext(ctx, sqlEnd, pid, wait, unsigned(p.keys.Anchors), unsigned(p.keys.Conns), id).Scan(&gone, new(int64))
	return gone, err
}

// int32s converts slot numbers for an int4[] parameter.
func int32s(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

// noClose hides the inner connector's Close from the coordination pool:
// closing that pool must not close the gate's connector.
type noClose struct{ c driver.Connector }

func (n noClose) Connect(ctx context.Context) (driver.Conn, error) { return n.c.Connect(ctx) }
func (n noClose) Driver() driver.Driver                            { return n.c.Driver() }
