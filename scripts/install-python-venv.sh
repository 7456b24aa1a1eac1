#!/usr/bin/env bash
# Installs pinned PyPI packages into a virtualenv cached at ~/.cache/outbox-relay/venv-<name>,
# for the tests that check the relay's output with another project's official library.
#
#   install-python-venv.sh NAME IMPORT_CHECK SKIPPED_WHAT PACKAGE==VERSION...
#
# NAME: the venv's suffix; IMPORT_CHECK: Python code that succeeds once the packages are there
# (the venv is then left alone); SKIPPED_WHAT: the test that skips without them, for the
# messages. Idempotent. Where something cannot be installed it exits 0, so a developer's run
# goes on (the test then prints a loud SKIPPING line naming what is missing) — but 1 under CI
# (`CI` set, as .ci/run sets it), where a missing dependency must fail the run, not skip tests.
set -u

NAME=$1
CHECK=$2
SKIPPED=$3
shift 3
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay"
VENV="$CACHE/venv-$NAME"
say() { echo "install-$NAME: $*" >&2; }
# Gives up: exit 1 under CI, 0 elsewhere.
give_up() {
    case "${CI:-}" in
        "" | 0 | false | False | FALSE) exit 0 ;;
        *) say "CI is set: failing the run"; exit 1 ;;
    esac
}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" >/dev/null 2>&1; then
    exit 0
fi
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m venv --help >/dev/null 2>&1; then
    say "installing python3-venv"
    if command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        (apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null) \
            || say "apt-get could not install python3-venv"
    fi
fi
mkdir -p "$CACHE"
rm -rf "$VENV"
if ! python3 -m venv "$VENV"; then
    say "python3 -m venv failed; $SKIPPED will be SKIPPED"
    rm -rf "$VENV"
    give_up
fi
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; then
    say "pip could not install $*; $SKIPPED will be SKIPPED"
    rm -rf "$VENV"
    give_up
fi
if ! "$VENV/bin/python" -c "$CHECK" >/dev/null 2>&1; then
    say "$* installed but the check failed; $SKIPPED will be SKIPPED"
    give_up
fi
say "$* in $VENV"
