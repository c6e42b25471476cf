-- ssicount's schema. Open runs it under an advisory lock, so it is
-- idempotent and concurrent deployments in one database do not race on it.
-- There is no counter: what is available is total minus the active rows.

CREATE TABLE IF NOT EXISTS ssicount_stock (
    sku   text    PRIMARY KEY,
    total integer NOT NULL CHECK (total >= 0)
);

CREATE TABLE IF NOT EXISTS ssicount_reservation (
    request_key text        PRIMARY KEY, -- one reservation per key, in every deployment
    user_id     text        NOT NULL,
    sku         text        NOT NULL REFERENCES ssicount_stock (sku),
    status      text        NOT NULL CHECK (status IN ('HELD', 'CONFIRMED', 'RELEASED', 'EXPIRED')),
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One active reservation per user and SKU.
CREATE UNIQUE INDEX IF NOT EXISTS ssicount_one_active_per_user
    ON ssicount_reservation (sku, user_id) WHERE status IN ('HELD', 'CONFIRMED');

-- The count of a SKU's active rows reads this index: the predicate lock
-- SSI takes on it is what a concurrent insert for the same SKU conflicts with.
CREATE INDEX IF NOT EXISTS ssicount_active_by_sku
    ON ssicount_reservation (sku) WHERE status IN ('HELD', 'CONFIRMED');

-- The expiry job's scan.
CREATE INDEX IF NOT EXISTS ssicount_held_by_expiry
    ON ssicount_reservation (sku, expires_at) WHERE status = 'HELD';
