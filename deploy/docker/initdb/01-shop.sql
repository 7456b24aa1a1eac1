-- The shop's schema (the first seed article's): orders and the transactional outbox.
-- Same as examples/support/orders.rs SCHEMA; runs once when the postgres container is created.
CREATE TABLE IF NOT EXISTS orders (
    id           uuid PRIMARY KEY,
    customer_id  uuid NOT NULL,
    total_cents  bigint NOT NULL,
    status       text NOT NULL
);
CREATE TABLE IF NOT EXISTS events_outbox (
    id            bigserial PRIMARY KEY,
    aggregate_id  uuid        NOT NULL,
    type          text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    dispatched_at timestamptz
);
