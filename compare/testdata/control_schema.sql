-- Schema of the negative controls (compare/controls_test.go): strategy A's
-- tables. The per-user partial unique index is created separately, so that
-- the check-then-insert control can go without it.
CREATE TABLE IF NOT EXISTS ctl_stock (
  sku       text PRIMARY KEY,
  total     int  NOT NULL CHECK (total >= 0),
  available int  NOT NULL,
  -- Lets "returned too many but still <= total" through: only the
  -- conservation audit catches that (seed C28-10).
  CONSTRAINT ctl_available_range CHECK (available >= 0 AND available <= total)
);
CREATE TABLE IF NOT EXISTS ctl_reservation (
  reservation_id bigserial PRIMARY KEY,
  request_key    text NOT NULL UNIQUE,
  user_id        text NOT NULL,
  sku            text NOT NULL REFERENCES ctl_stock,
  status         text NOT NULL CHECK (status IN ('HELD','CONFIRMED','RELEASED','EXPIRED')),
  expires_at     timestamptz NOT NULL
);
