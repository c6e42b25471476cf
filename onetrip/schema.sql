-- Schema of onetrip, the one-round-trip hot row. Every statement is
-- idempotent: deployments with disjoint SKUs share one database, and Open runs
-- this under an advisory lock whenever the last object below is missing.
-- Every name starts with onetrip_ so it never meets another strategy's tables.

-- One row per SKU: the hot row, as in hotrow. available is derived (the
-- reservation rows are the truth); the CHECK catches a return past the total.
CREATE TABLE IF NOT EXISTS onetrip_stock (
    sku       text PRIMARY KEY,
    total     int  NOT NULL CHECK (total >= 0),
    available int  NOT NULL,
    CONSTRAINT onetrip_stock_available_range CHECK (available >= 0 AND available <= total)
);

-- One row per request key, whatever happened to it later. Rows are never
-- deleted, so a key seen once is answered REPLAY or KEY_REUSED forever.
-- There is deliberately no foreign key to onetrip_stock: its check would take
-- a KEY SHARE lock on the stock row that the same statement has just updated,
-- and while any other transaction holds a lock on that row PostgreSQL would
-- record every such pair of lockers as a new MultiXact (hotrow's WAL growth
-- under contention; docs/performance-method.md). Reserve checks the SKU
-- against the deployment's config before it touches the database, and the
-- decrement finds no row for an unknown SKU anyway.
-- Its columns are the contract's Reservation, as in every strategy's own
-- reservation table: alike on purpose, and never shared between strategies.
-- Unlike the others it has no surrogate id: the key is the primary key
-- (requirement 2: one reservation per key, across the whole table), so a
-- reservation writes two index entries, not four, and draws no sequence
-- value. At one client every microsecond of the statement is on the
-- critical path (docs/performance.md, the targets).
CREATE TABLE IF NOT EXISTS onetrip_reservation (
    request_key text        PRIMARY KEY,
    user_id     text        NOT NULL,
    sku         text        NOT NULL,
    status      text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT onetrip_reservation_status_check CHECK (status IN ('HELD', 'CONFIRMED', 'RELEASED', 'EXPIRED'))
);

-- Reserve's statement (reserve.go, sqlInsertAndTake) inserts the
-- reservation before it decrements the SKU's row, and relies on finding that
-- row: an UPDATE that found none would let the reservation commit without
-- its unit. Reserve checks the SKU against the deployment's config and Open
-- inserted a row for each; this makes sure no row goes away afterwards.
CREATE OR REPLACE FUNCTION onetrip_stock_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'onetrip: stock rows are never deleted (a reservation could commit without its unit)'
        USING ERRCODE = 'restrict_violation';
END
$$;
CREATE OR REPLACE TRIGGER onetrip_stock_kept BEFORE DELETE OR TRUNCATE ON onetrip_stock
    FOR EACH STATEMENT EXECUTE FUNCTION onetrip_stock_kept();

-- Requirement 3 (PostgreSQL docs 11.8, example 11.3): at most one active
-- reservation per user and SKU; any number of RELEASED and EXPIRED ones.
-- It is also the expiry job's scan: the job reads a SKU's active entries
-- and keeps the due HELD ones. Unlike the other strategies there is no
-- index of due HELD rows of its own: on the HELD path every index entry is
-- on the statement's critical path at one client, and without that index
-- pgbench ran this statement a median 9% faster (six pairs, back to back,
-- 1 and 2 clients, 2 cores, fsync on; measured once by hand on
-- 2026-12-05, not by make bench; that run's index also carried expires_at
-- as an INCLUDE column, which the job's plan, a bitmap scan reading the
-- rows, never uses). The job's scan is bounded by the SKU's active
-- reservations, at most its total units, as the audit's count already is.
-- Created last: Open treats its presence as "the schema is complete".
CREATE UNIQUE INDEX IF NOT EXISTS onetrip_reservation_one_active ON onetrip_reservation (sku, user_id)
    WHERE status IN ('HELD', 'CONFIRMED');
