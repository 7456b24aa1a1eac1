# outbox-relay container image: the relay binary plus the two example programs (place_order,
# idempotent_consumer) that docker-compose.yml runs next to it.
#
#   docker build -t outbox-relay .
#   docker run --rm -v $PWD/my-relay.toml:/etc/outbox-relay/outbox-relay.toml outbox-relay run

# ---- build ------------------------------------------------------------------------------------
FROM rust:1.95-bookworm AS builder
# rdkafka builds librdkafka from source (./configure + make, C and C++) with TLS (OpenSSL) and
# zlib; pkg-config finds both.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential pkg-config libssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --no-default-features --bin outbox-relay --example place_order --example idempotent_consumer \
    && mkdir -p /out \
    && cp target/release/outbox-relay target/release/examples/place_order \
          target/release/examples/idempotent_consumer /out/

# ---- run --------------------------------------------------------------------------------------
FROM debian:bookworm-slim
# ca-certificates: TLS to PostgreSQL and Kafka; libssl3: librdkafka's TLS (linked dynamically).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin relay
COPY --from=builder /out/ /usr/local/bin/
COPY config/outbox-relay.toml /etc/outbox-relay/outbox-relay.example.toml
ENV OUTBOX_RELAY_CONFIG=/etc/outbox-relay/outbox-relay.toml
USER 10001
# [http] listen (metrics, /healthz, /readyz) in the shipped configs.
EXPOSE 9187
ENTRYPOINT ["outbox-relay"]
CMD ["run"]
