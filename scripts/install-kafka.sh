#!/usr/bin/env bash
# Installs Apache Kafka (the KRaft broker, its tools and their runtime dependencies) from Maven
# Central into ~/.cache/outbox-relay/kafka-<version>/libs, for the integration tests and the
# benchmarks that run against a real broker. Java 17 (Debian's JDK) is installed when missing.
#
# The broker is a plain classpath, started the way the tests' harness does it
# (tests/it/harness/kafka_real.rs):
#   java -cp '<dir>/libs/*' kafka.tools.StorageTool format -t <cluster-id> -c server.properties
#   java -cp '<dir>/libs/*' kafka.Kafka server.properties
# The harness finds the directory itself (KAFKA_HOME overrides it); this script prints it as its
# last line. A second run with everything cached asks no registry and takes about a second.
#
# Exits non-zero, naming what failed, when the broker cannot be installed: the Kafka suites
# are the product's core path, so CI stops here rather than skip them.
set -euo pipefail

VERSION="${KAFKA_VERSION:-4.3.1}"
LOG4J_VERSION=2.25.4
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay"
HOME_DIR="$CACHE/kafka-$VERSION"
LIBS="$HOME_DIR/libs"
STAMP="$HOME_DIR/.complete"

say() { echo "install-kafka: $*" >&2; }

if ! command -v java >/dev/null 2>&1 || ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then
    say "installing openjdk-17-jre-headless (Kafka 4 brokers need Java 17 or newer)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$VERSION" ] && ls "$LIBS"/kafka_2.13-"$VERSION".jar >/dev/null 2>&1; then
    say "Kafka $VERSION present"
    echo "$HOME_DIR"
    exit 0
fi

if ! command -v mvn >/dev/null 2>&1; then
    say "installing maven (resolves the broker's dependency tree from Maven Central)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq maven >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# kafka_2.13 is the broker (kafka.Kafka, kafka.tools.StorageTool); kafka-tools brings the admin
# commands (AclCommand, ConfigCommand); log4j-slf4j-impl routes the broker's slf4j logging to
# the log4j2 configuration written below.
cat >"$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>outbox-relay.test</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF

say "resolving org.apache.kafka:kafka_2.13:$VERSION and its runtime dependencies"
rm -rf "$LIBS"
mkdir -p "$LIBS"
if ! mvn -q -B -f "$work/pom.xml" -Dmaven.repo.local="$CACHE/m2" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIBS" >"$work/mvn.log" 2>&1; then
    cat "$work/mvn.log" >&2
    say "could not resolve Kafka $VERSION from Maven Central (log above)"
    exit 1
fi

cat >"$HOME_DIR/log4j2.properties" <<'EOF'
# The broker's log: warnings and errors, plus the lines that say it started or stopped.
rootLogger.level=WARN
rootLogger.appenderRef.out.ref=OUT
appender.out.type=Console
appender.out.name=OUT
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
logger.server.name=kafka.server.KafkaRaftServer
logger.server.level=INFO
EOF

# A smoke check: the storage tool answers (the classpath is whole).
if ! java -cp "$LIBS/*" kafka.tools.StorageTool random-uuid >/dev/null 2>"$work/smoke.log"; then
    cat "$work/smoke.log" >&2
    say "the installed classpath does not run kafka.tools.StorageTool"
    exit 1
fi
echo "$VERSION" >"$STAMP"
say "Kafka $VERSION installed ($(ls "$LIBS" | wc -l) jars)"
echo "$HOME_DIR"
