-- Schema of combine, the combining hot row. Every statement is
-- idempotent: deployments with disjoint SKUs share one database, and Open runs
-- this under an advisory lock whenever the last object below is missing.
-- Every name starts with combine_ so it never meets another strategy's tables.

-- One row per SKU: the hot row, as in hotrow. available is derived (the
-- reservation rows are the truth); the CHECK catches a return past the total.
CREATE TABLE IF NOT EXISTS combine_stock (
    sku       text PRIMARY KEY,
    total     int  NOT NULL CHECK (total >= 0),
    available int  NOT NULL,
    CONSTRAINT combine_stock_available_range CHECK (available >= 0 AND available <= total)
);

-- One row per request key, whatever happened to it later. Rows are never
-- deleted, so a key seen once is answered REPLAY or KEY_REUSED forever.
-- There is deliberately no foreign key to combine_stock: each inserted row's
-- check would take a KEY SHARE lock on the stock row that the same batch
-- holds, and while another batch holds it too PostgreSQL would record the
-- lockers as a MultiXact (hotrow's WAL growth under contention;
-- docs/performance-method.md). Reserve checks the SKU against the
-- deployment's config before a request joins a batch.
-- Its columns are the contract's Reservation, as in every strategy's own
-- reservation table: alike on purpose, and never shared between strategies.
CREATE TABLE IF NOT EXISTS combine_reservation (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_key text        NOT NULL,
    user_id     text        NOT NULL,
    sku         text        NOT NULL,
    status      text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- Requirement 2: one reservation per key, across the whole table.
    CONSTRAINT combine_reservation_request_key UNIQUE (request_key),
    CONSTRAINT combine_reservation_status_check CHECK (status IN ('HELD', 'CONFIRMED', 'RELEASED', 'EXPIRED'))
);

-- The expiry job's scan: due HELD rows of a deployment's SKUs.
CREATE INDEX IF NOT EXISTS combine_reservation_held_due ON combine_reservation (sku, expires_at)
    WHERE status = 'HELD';

-- Requirement 3 (PostgreSQL docs 11.8, example 11.3): at most one active
-- reservation per user and SKU; any number of RELEASED and EXPIRED ones.
-- Created last: Open treats its presence as "the schema is complete".
CREATE UNIQUE INDEX IF NOT EXISTS combine_reservation_one_active ON combine_reservation (sku, user_id)
    WHERE status IN ('HELD', 'CONFIRMED');
