#!/usr/bin/env bash
# Installs the `tansu` Kafka-compatible broker used by the integration tests
# (tests/it/harness/tansu.rs). Building it from crates.io takes ~11 minutes on a
# 2-core machine, so it is skipped when a binary is already present.
#
# It never fails the caller: tests that need tansu skip loudly when it is
# missing, so a failed install must not break CI.
#
# Tunables (environment):
#   CARGO_BUILD_JOBS   parallel rustc jobs (default 1, so it can run beside other builds)
#   CARGO_TARGET_DIR   build dir (default /tmp/tansu-target, kept out of the repo's target/)
#   TANSU_NICE         nice level (default 19)
set -u

CARGO_HOME_BIN="${CARGO_HOME:-$HOME/.cargo}/bin"

if command -v tansu >/dev/null 2>&1; then
    echo "install-tansu: tansu already on PATH: $(command -v tansu)"
    exit 0
fi
if [ -x "$CARGO_HOME_BIN/tansu" ]; then
    echo "install-tansu: tansu already installed: $CARGO_HOME_BIN/tansu"
    exit 0
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
    echo "install-tansu: cargo not found; tansu NOT installed (tansu tests will skip)" >&2
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
    exit 0
fi

export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/tmp/tansu-target}"
NICE="${TANSU_NICE:-19}"

install() {
    nice -n "$NICE" cargo install tansu --features dynostore,libsql "$@"
}

echo "install-tansu: building tansu (jobs=$CARGO_BUILD_JOBS, target=$CARGO_TARGET_DIR); this takes ~11 min"
if install --locked; then
    echo "install-tansu: installed $CARGO_HOME_BIN/tansu (--locked)"
    exit 0
fi
echo "install-tansu: --locked install failed; retrying without --locked" >&2
if install; then
    echo "install-tansu: installed $CARGO_HOME_BIN/tansu"
    exit 0
fi

echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
echo "install-tansu: 'cargo install tansu' FAILED; tansu NOT installed." >&2
echo "install-tansu: tests needing tansu will be SKIPPED." >&2
echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
exit 0
