-- Strategy "advisorylock": no stock counter at all. The number of units left
-- is derived (total minus active reservations) while holding a per-SKU
-- transaction-level advisory lock, so at most one transaction per SKU counts
-- and inserts at a time.
CREATE TABLE IF NOT EXISTS advisorylock_stock (
  sku   text PRIMARY KEY,
  total int  NOT NULL CHECK (total >= 0)
);
CREATE TABLE IF NOT EXISTS advisorylock_reservation (
  request_key text PRIMARY KEY,
  user_id     text NOT NULL,
  sku         text NOT NULL REFERENCES advisorylock_stock,
  status      text NOT NULL CHECK (status IN ('HELD','CONFIRMED','RELEASED','EXPIRED')),
  expires_at  timestamptz NOT NULL
);
-- The per-SKU lock already serialises the check; the index is the backstop
-- that makes a missing lock a constraint error instead of a second hold.
CREATE UNIQUE INDEX IF NOT EXISTS advisorylock_one_active
  ON advisorylock_reservation (sku, user_id) WHERE status IN ('HELD','CONFIRMED');
CREATE INDEX IF NOT EXISTS advisorylock_active_by_sku
  ON advisorylock_reservation (sku) WHERE status IN ('HELD','CONFIRMED');
