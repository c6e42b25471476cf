package pgstrategy

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// Tx is a transaction held open on a pool connection of its own, from Begin
// to Commit or Rollback: what a strategy.Session or strategy.ExpirySession
// is made of. A strategy embeds *Tx in its session type and adds Reserve or
// ExpireDue, running them through InTx.
//
// Its methods, and InTx, serialise on a mutex. Exactly one of Commit or
// Rollback ends it and gives the connection back to the pool; after the end,
// InTx and Commit return strategy.ErrSessionEnded and Rollback returns nil,
// as strategy.Transaction says.
type Tx struct {
	name  string
	hooks TxHooks
	conn  *pgxpool.Conn
	tx    pgx.Tx
	pid   uint32

	mu    sync.Mutex
	ended bool
}

// TxHooks keep state that a strategy holds outside the database (memquota's
// counters) in step with the transaction. Each runs with the Tx's mutex
// held, so it may read and write what the strategy's InTx callbacks write.
type TxHooks struct {
	// AroundCommit, when set, runs in place of the plain COMMIT. It is given
	// commit, which sends COMMIT and returns its error; it calls it at most
	// once, and returns the error Commit reports. If it returns without
	// calling commit, the transaction is rolled back (and AfterRollback
	// runs): a strategy that finds it must not commit any more (its node
	// was restarted) returns its reason.
	AroundCommit func(ctx context.Context, commit func(context.Context) error) error

	// AfterRollback, when set, runs once the transaction has been rolled
	// back, whatever ROLLBACK returned: the work did not commit. It does
	// not run after a COMMIT that failed (PostgreSQL may or may not have
	// committed it; pgx.ErrTxCommitRollback says it did not).
	AfterRollback func()
}

// Begin acquires a connection from db for the Tx's whole life, begins a
// transaction at iso on it ("" is the server's default level) and records
// the backend PID. name (the strategy's) prefixes the errors of Commit and
// Rollback; Begin's own errors are unprefixed, for the caller to wrap.
func Begin(ctx context.Context, db *pgxpool.Pool, name string, iso pgx.TxIsoLevel, hooks TxHooks) (*Tx, error) {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire: %w", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("begin: %w", err)
	}
	return &Tx{name: name, hooks: hooks, conn: conn, tx: tx, pid: conn.Conn().PgConn().PID()}, nil
}

// Backends is the backend PID of the Tx's connection, valid from Begin on.
func (t *Tx) Backends() []uint32 { return []uint32{t.pid} }

// InTx runs fn with t's open transaction, under t's mutex, and returns what
// fn returns. After the end it returns strategy.ErrSessionEnded without
// calling fn.
func InTx[T any](t *Tx, fn func(tx pgx.Tx) (T, error)) (T, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		var zero T
		return zero, strategy.ErrSessionEnded
	}
	return fn(t.tx)
}

// AsSession returns s as a strategy.Session, and a nil interface (not a
// typed nil) with err: OpenSession is `return pgstrategy.AsSession(n.open(ctx))`.
func AsSession[S strategy.Session](s S, err error) (strategy.Session, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}

// AsExpirySession is AsSession for OpenExpirySession.
func AsExpirySession[S strategy.ExpirySession](s S, err error) (strategy.ExpirySession, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Commit commits the transaction (through TxHooks.AroundCommit when set)
// and gives the connection back. After the end it returns
// strategy.ErrSessionEnded.
func (t *Tx) Commit(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return strategy.ErrSessionEnded
	}
	t.ended = true
	defer t.conn.Release()
	if t.hooks.AroundCommit == nil {
		if err := t.tx.Commit(ctx); err != nil {
			return fmt.Errorf("%s: session commit: %w", t.name, err)
		}
		return nil
	}
	sent := false
	err := t.hooks.AroundCommit(ctx, func(ctx context.Context) error {
		if sent {
			return fmt.Errorf("%s: session commit: COMMIT already sent", t.name)
		}
		sent = true
		if err := t.tx.Commit(ctx); err != nil {
			return fmt.Errorf("%s: session commit: %w", t.name, err)
		}
		return nil
	})
	if !sent {
		_ = t.rollback(ctx) // the hook's error says why; the work is undone either way
	}
	return err
}

// Rollback undoes the transaction's work and gives the connection back. A
// transaction pgx already closed (pgx.ErrTxClosed) is no error; after the
// end Rollback does nothing and returns nil.
func (t *Tx) Rollback(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return nil
	}
	t.ended = true
	defer t.conn.Release()
	return t.rollback(ctx)
}

// rollback sends ROLLBACK and runs AfterRollback; the caller holds t.mu.
func (t *Tx) rollback(ctx context.Context) error {
	err := t.tx.Rollback(ctx)
	if t.hooks.AfterRollback != nil {
		t.hooks.AfterRollback()
	}
	if err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("%s: session rollback: %w", t.name, err)
	}
	return nil
}
