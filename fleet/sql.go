package fleet

// The statements of the fleet, each a constant with bind parameters.
// Advisory lock keys are bound as int4 (the two-key form); in pg_locks,
// classid and objid are oid, compared as int8 with the keys as unsigned
// 32-bit numbers (unsigned). Every parameter is cast, so that no type is
// left to the server's inference.

// sqlJoin takes the membership lock ($1 Members, $2 id) without waiting
// and sets idle_in_transaction_session_timeout to $3 ms; it returns the
// session's backend pid and whether the lock was taken.
const sqlJoin = `SELECT pg_backend_pid(), pg_try_advisory_lock($1::int4, $2::int4),
	set_config('idle_in_transaction_session_timeout', $3::text, false)`

// sqlReclaim ends the other sessions holding the lock ($1 Members as
// unsigned, $2 id) and returns how many it ended.
const sqlReclaim = `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_locks
	WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND pid <> pg_backend_pid()
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND classid::int8 = $1::int8 AND objid::int8 = $2::int8`

// sqlLockShared takes the shared lock ($1, $2), waiting for it: a member's
// anchor (Anchors, id) and a connection's tag (Conns, id).
const sqlLockShared = `SELECT pg_advisory_lock_shared($1::int4, $2::int4)`

// sqlLeave unlocks all of the coordination session's locks and publishes
// a B of 0.
const sqlLeave = `SELECT set_config('application_name', 'bulkhead fleet b=0', false), pg_advisory_unlock_all()`

// sqlUnlockAll unlocks all of the session's locks.
const sqlUnlockAll = `SELECT pg_advisory_unlock_all()`

// sqlRead reads the fleet's locks ($1 the keys as unsigned) with their
// sessions: classid, objid, pid, application_name, state (empty when it
// cannot be seen: another role's session, without pg_read_all_stats) and,
// while the session runs no statement, how many ms ago its last one ended
// (else 0). An orphan is told by its state: a dead client's connection
// that is idle will never run again (the server ends it at its next read).
const sqlRead = `SELECT l.classid::int8, l.objid::int8, l.pid, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(CASE WHEN a.state LIKE 'idle%' THEN (extract(epoch FROM statement_timestamp() - a.state_change) * 1000)::int8 END, 0)
	FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid::int8 = ANY($1::int8[])`

// sqlReadPublishing is sqlRead that first sets the session's
// application_name to $2, the member's state.
const sqlReadPublishing = `WITH me AS (SELECT set_config('application_name', $2::text, false))
	SELECT l.classid::int8, l.objid::int8, l.pid, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(CASE WHEN a.state LIKE 'idle%' THEN (extract(epoch FROM statement_timestamp() - a.state_change) * 1000)::int8 END, 0)
	FROM me, pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid::int8 = ANY($1::int8[])`

// sqlGrowLock takes the transaction lock ($1 Grow, 0) without waiting and
// returns whether it did.
const sqlGrowLock = `SELECT pg_try_advisory_xact_lock($1::int4, 0)`

// sqlTake locks the slots ($1 Slots, s) for s in $2 without waiting and
// returns those it locked.
const sqlTake = `SELECT s FROM unnest($2::int4[]) AS s WHERE pg_try_advisory_lock($1::int4, s)`

// sqlUnlock unlocks the slots ($1 Slots, s) for s in $3, and publishes $2,
// the member's state, as the session's application_name.
const sqlUnlock = `SELECT set_config('application_name', $2::text, false), pg_advisory_unlock($1::int4, s)
	FROM unnest($3::int4[]) AS s`

// sqlEnd ends the session $1, waiting up to $2 ms, and returns whether it
// is gone; it also ends the sessions holding (Anchors as unsigned $3, $5)
// and the idle ones holding (Conns as unsigned $4, $5).
const sqlEnd = `SELECT pg_terminate_backend($1::int4, $2::int8),
	(SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND (l.classid::int8 = $3::int8 OR l.classid::int8 = $4::int8 AND a.state = 'idle')
	AND l.objid::int8 = $5::int8)`

// unsigned is a key as pg_locks shows it in classid: an unsigned 32-bit
// number.
func unsigned(k int32) int64 { return int64(uint32(k)) }
