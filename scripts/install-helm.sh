#!/usr/bin/env bash
# Builds helm (and, where kubectl is not installed, kustomize) from the Go module proxy into
# ~/.cache/outbox-relay/go-tools-<tool>-<version>/bin, for scripts/check-deploy.sh, which renders
# the Helm chart (`helm template`) and the kustomize base and overlays. Prints the directory that
# holds the binaries as its last line. A second run with everything cached asks no registry.
#
#   install-helm.sh            helm only
#   install-helm.sh kustomize  helm, and kustomize unless `kubectl kustomize` works
#
# Exits non-zero, naming what failed, when a tool cannot be built: check-deploy.sh is a CI check,
# and a chart nobody rendered must not pass.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
KUSTOMIZE_VERSION="${KUSTOMIZE_VERSION:-v5.7.1}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay"
BIN="$CACHE/go-tools/bin"

say() { echo "install-helm: $*" >&2; }

if ! command -v go >/dev/null 2>&1; then
    say "no Go toolchain (go) on PATH: helm is built with \`go install\` from the Go module proxy"
    exit 1
fi

# go install MODULE@VERSION NAME: builds into a directory per version, so a version bump rebuilds
# and an interrupted build never leaves a half-written binary where the stamp says it is done.
build() {
    local module=$1 version=$2 name=$3
    local dir="$CACHE/go-tools-$name-$version"
    if [ -x "$dir/bin/$name" ] && [ -f "$dir/.complete" ]; then
        return 0
    fi
    say "building $name $version from the Go module proxy ($module@$version; a few minutes on 2 cores)"
    rm -rf "$dir"
    mkdir -p "$dir/bin"
    # The module cache stays in GOPATH (shared with other Go builds); only the binary is ours.
    if ! GOBIN="$dir/bin" CGO_ENABLED=0 go install "$module@$version"; then
        say "go install $module@$version failed"
        rm -rf "$dir"
        exit 1
    fi
    touch "$dir/.complete"
}

mkdir -p "$BIN"
build helm.sh/helm/v3/cmd/helm "$HELM_VERSION" helm
ln -sf "$CACHE/go-tools-helm-$HELM_VERSION/bin/helm" "$BIN/helm"
say "$("$BIN/helm" version --short)"

if [ "${1:-}" = kustomize ]; then
    if command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1; then
        say "kubectl kustomize is there: no kustomize build needed"
    else
        build sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION" kustomize
        ln -sf "$CACHE/go-tools-kustomize-$KUSTOMIZE_VERSION/bin/kustomize" "$BIN/kustomize"
        say "kustomize $("$BIN/kustomize" version)"
    fi
fi
echo "$BIN"
