-- Schema of strategy A (hotrow), after seed 000. Every statement is
-- idempotent: deployments with disjoint SKUs share one database, and Open runs
-- this under an advisory lock whenever the last object below is missing.

-- One row per SKU: the hot row. available is derived (the reservation rows
-- are the truth); the CHECK catches a return past the total, only the
-- conservation audit catches "returned too many but still <= total".
CREATE TABLE IF NOT EXISTS sku_stock (
    sku       text PRIMARY KEY,
    total     int  NOT NULL CHECK (total >= 0),
    available int  NOT NULL,
    CONSTRAINT sku_stock_available_range CHECK (available >= 0 AND available <= total)
);

-- One row per request key, whatever happened to it later. Rows are never
-- deleted, so a key seen once is answered REPLAY or KEY_REUSED forever.
-- Its columns are the contract's Reservation, as in every strategy's own
-- reservation table: alike on purpose, and never shared between strategies.
CREATE TABLE IF NOT EXISTS reservation (
    reservation_id bigserial   PRIMARY KEY,
    request_key    text        NOT NULL,
    user_id        text        NOT NULL,
    sku            text        NOT NULL,
    status         text        NOT NULL,
    expires_at     timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    -- Requirement 2: the arbiter of INSERT ... ON CONFLICT (request_key).
    CONSTRAINT reservation_request_key UNIQUE (request_key),
    -- An unknown SKU cannot be reserved (23503); Reserve checks the
    -- deployment's SKUs before this ever fires.
    CONSTRAINT reservation_sku_fkey FOREIGN KEY (sku) REFERENCES sku_stock (sku),
    CONSTRAINT reservation_status_check CHECK (status IN ('HELD', 'CONFIRMED', 'RELEASED', 'EXPIRED'))
);

-- The expiry job's scan: due HELD rows of a deployment's SKUs.
CREATE INDEX IF NOT EXISTS reservation_held_due ON reservation (sku, expires_at) WHERE status = 'HELD';

-- Requirement 3 (PostgreSQL docs 11.8, example 11.3): at most one active
-- reservation per user and SKU; any number of RELEASED and EXPIRED ones.
-- Created last: Open treats its presence as "the schema is complete".
CREATE UNIQUE INDEX IF NOT EXISTS reservation_one_active ON reservation (sku, user_id)
    WHERE status IN ('HELD', 'CONFIRMED');
