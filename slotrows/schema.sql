-- Schema of strategy B (slotrows): one row per unit. Every statement is
-- idempotent: deployments with disjoint SKUs share one database, and Open runs
-- this under an advisory lock whenever the last object below is missing.
-- Every name starts with slotrows_ so it never meets another strategy's tables.

-- One row per SKU: what the deployment opened it with. Its slots are
-- inserted in the same transaction, so a SKU row never exists without them.
CREATE TABLE IF NOT EXISTS slotrows_sku (
    sku   text PRIMARY KEY,
    total int  NOT NULL CHECK (total >= 0)
);

-- One row per request key, whatever happened to it later. Rows are never
-- deleted, so a key seen once is answered REPLAY or KEY_REUSED forever.
-- There is deliberately no foreign key to slotrows_sku: every insert would
-- take a KEY SHARE lock on the one SKU row that all claimers of a hot SKU
-- share (a multixact per concurrent insert). Reserve checks the SKU against
-- the deployment's config before it touches the database.
-- Its columns are the contract's Reservation, as in every strategy's own
-- reservation table: alike on purpose, and never shared between strategies.
CREATE TABLE IF NOT EXISTS slotrows_reservation (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_key text        NOT NULL,
    user_id     text        NOT NULL,
    sku         text        NOT NULL,
    status      text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- Requirement 2: one reservation per key, across the whole table.
    CONSTRAINT slotrows_reservation_request_key UNIQUE (request_key),
    CONSTRAINT slotrows_reservation_status_check CHECK (status IN ('HELD', 'CONFIRMED', 'RELEASED', 'EXPIRED'))
);

-- Requirement 3 (PostgreSQL docs 11.8, example 11.3): at most one active
-- reservation per user and SKU; any number of RELEASED and EXPIRED ones.
-- The audit counts active reservations per SKU from it too.
CREATE UNIQUE INDEX IF NOT EXISTS slotrows_reservation_one_active ON slotrows_reservation (sku, user_id)
    WHERE status IN ('HELD', 'CONFIRMED');

-- The expiry job's scan: due HELD rows of a deployment's SKUs.
CREATE INDEX IF NOT EXISTS slotrows_reservation_held_due ON slotrows_reservation (sku, expires_at)
    WHERE status = 'HELD';

-- One row per unit, pre-split at Open (slot_no 1..total). holder is the
-- reservation that holds the unit, NULL while it is free. A row has one
-- holder column, so a unit has at most one holder; the UNIQUE constraint adds
-- the converse, one reservation holds at most one unit, and the foreign key
-- that a holder is a real reservation.
CREATE TABLE IF NOT EXISTS slotrows_slot (
    sku     text   NOT NULL REFERENCES slotrows_sku (sku),
    slot_no int    NOT NULL CHECK (slot_no >= 1),
    holder  bigint REFERENCES slotrows_reservation (id),
    PRIMARY KEY (sku, slot_no),
    CONSTRAINT slotrows_slot_one_per_holder UNIQUE (holder)
);

-- The free slots, in slot order: a claim is an index probe into this partial
-- index however full the SKU is (without it, claims degrade to scans over the
-- taken slots). Created last: Open treats its presence as "the schema is
-- complete".
CREATE INDEX IF NOT EXISTS slotrows_slot_free ON slotrows_slot (sku, slot_no)
    WHERE holder IS NULL;
