#!/usr/bin/env bash
# Renders every Kubernetes object this repository ships and validates it (docs/kubernetes.md,
# "Checked in CI"):
#   - the kustomize base (`kubectl apply -k deploy/kubernetes`), the monitoring overlay and the
#     backfill Job, rendered with `kubectl kustomize` (or kustomize from the Go module proxy);
#   - the Helm chart, rendered with `helm template` (helm from the Go module proxy,
#     scripts/install-helm.sh) with its defaults and with every option on (ci/*-values.yaml),
#     and refusing to render without the PostgreSQL URL;
#   - built-in kinds against the Kubernetes $K8S_VERSION schemas, strictly (unknown fields fail),
#     with PyPI's kubernetes-validate, which bundles them;
#   - the Prometheus Operator's kinds (ServiceMonitor, PrometheusRule: CRDs, not in those
#     schemas) decoded strictly into the operator's own Go types, every alert expression and
#     every dashboard query parsed by Prometheus' PromQL parser (scripts/crdcheck), and each
#     metric they select checked against src/ops/metrics.rs, the one place metric names live.
# An object of any other kind fails the run: nothing passes unchecked.
#
# Tools are cached under ~/.cache/outbox-relay. Where one cannot be installed the script prints a
# loud SKIPPING line and exits 0 — but 1 under CI (`CI` set, as .ci/run sets it).
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION=1.31.0
KUBERNETES_VALIDATE=kubernetes-validate==1.37.0
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay"
say() { echo "check-deploy: $*" >&2; }
missing() {
    case "${CI:-}" in
        "" | 0 | false | False | FALSE)
            say "SKIPPING the deploy checks: $* (CI fails here)"
            exit 0 ;;
        *) say "$* — CI is set: failing the run"; exit 1 ;;
    esac
}

# ---- tools
bin=$(bash scripts/install-helm.sh kustomize | tail -1) || missing "helm could not be built (scripts/install-helm.sh)"
HELM="$bin/helm"
if command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1; then
    kustomize() { kubectl kustomize "$@"; }
else
    kustomize() { "$bin/kustomize" build "$@"; }
fi
CI= bash scripts/install-python-venv.sh kubernetes-validate "import kubernetes_validate" \
    "the deploy schema check" "$KUBERNETES_VALIDATE"
VENV="$CACHE/venv-kubernetes-validate"
[ -x "$VENV/bin/kubernetes-validate" ] || missing "kubernetes-validate could not be installed from PyPI"
# crdcheck, rebuilt when its source changes.
src_hash=$(cat scripts/crdcheck/go.mod scripts/crdcheck/go.sum scripts/crdcheck/main.go | sha256sum | cut -c1-16)
CRDCHECK="$CACHE/go-tools-crdcheck-$src_hash/crdcheck"
if [ ! -x "$CRDCHECK" ]; then
    say "building scripts/crdcheck (the Prometheus Operator's types and PromQL parser, from the Go module proxy)"
    mkdir -p "$(dirname "$CRDCHECK")"
    (cd scripts/crdcheck && CGO_ENABLED=0 go build -o "$CRDCHECK.tmp" .) || missing "scripts/crdcheck did not build"
    mv "$CRDCHECK.tmp" "$CRDCHECK"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# ---- render
say "rendering the kustomize base and overlays"
kustomize deploy/kubernetes > "$out/kustomize-default.yaml"
kustomize deploy/kubernetes/overlays/monitoring > "$out/kustomize-monitoring.yaml"
cp deploy/kubernetes/base/backfill-job.yaml "$out/backfill-job.yaml"
if grep -q 'monitoring.coreos.com' "$out/kustomize-default.yaml"; then
    say "deploy/kubernetes renders a Prometheus Operator object: the base must apply on a vanilla cluster"
    exit 1
fi

say "rendering the Helm chart ($("$HELM" version --short))"
chart=deploy/helm/outbox-relay
# The chart reads the overlay's alert rules through a link; helm says so on stderr every time.
helm_template() { "$HELM" template outbox-relay "$chart" "$@" 2> >(grep -v 'found symbolic link in path' >&2); }
if ! lint=$("$HELM" lint --strict "$chart" --set-string secret.env.OUTBOX_RELAY__POSTGRES__URL=postgres://relay@db/app 2>&1); then
    grep -v 'found symbolic link in path' <<<"$lint" >&2
    say "helm lint --strict fails"
    exit 1
fi
helm_template --set-string secret.env.OUTBOX_RELAY__POSTGRES__URL=postgres://relay@db/app > "$out/helm-default.yaml"
for values in "$chart"/ci/*-values.yaml; do
    helm_template -f "$values" > "$out/helm-$(basename "$values" -values.yaml).yaml"
done
# Bad values are refused with the fix, not rendered into a pod that crash-loops.
refused() {
    local expect=$1
    shift
    local err
    if err=$("$HELM" template outbox-relay "$chart" "$@" 2>&1 >/dev/null); then
        say "helm template $* rendered; it must fail with \"$expect\""
        exit 1
    fi
    if ! grep -qF "$expect" <<<"$err"; then
        say "helm template $* failed without saying \"$expect\": $err"
        exit 1
    fi
}
refused "set secret.env.OUTBOX_RELAY__POSTGRES__URL"
refused "every key must be an OUTBOX_RELAY__<SECTION>__<KEY> override" \
    --set-string secret.env.OUTBOX_RELAY__POSTGRES__URL=postgres://x --set-string secret.env.PGPASSWORD=x

# ---- sort the objects: built-in kinds to kubernetes-validate, the operator's to crdcheck
"$VENV/bin/python" - "$out" <<'EOF'
import pathlib, sys, yaml
out = pathlib.Path(sys.argv[1])
builtin = {"v1", "apps/v1", "batch/v1", "policy/v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1"}
(out / "builtin").mkdir()
(out / "monitoring").mkdir()
counts = {}
for f in sorted(out.glob("*.yaml")):
    docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
    if not docs:
        sys.exit(f"check-deploy: {f.name} renders no object")
    for i, doc in enumerate(docs):
        api, kind = doc.get("apiVersion", ""), doc.get("kind", "")
        where = "builtin" if api in builtin else "monitoring" if api.startswith("monitoring.coreos.com/") else None
        if where is None:
            sys.exit(f"check-deploy: {f.name}: {kind} of {api!r} has no schema here: it would pass unchecked")
        (out / where / f"{f.stem}-{i}-{kind}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        counts[f"{f.stem} {kind}"] = counts.get(f"{f.stem} {kind}", 0) + 1
for k, n in sorted(counts.items()):
    print(f"check-deploy:   {k}" + (f" ×{n}" if n > 1 else ""), file=sys.stderr)
EOF

say "validating $(ls "$out/builtin" | wc -l) built-in objects against the Kubernetes $K8S_VERSION schemas (strict)"
if ! "$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$out"/builtin/*.yaml > "$out/validate.log" 2>&1 \
    || grep -qE '^(WARN|ERROR)' "$out/validate.log"; then
    cat "$out/validate.log" >&2
    say "a rendered object does not match the Kubernetes $K8S_VERSION schema"
    exit 1
fi

say "checking $(ls "$out/monitoring" | wc -l) Prometheus Operator objects and the Grafana dashboard"
"$CRDCHECK" objects "$out"/monitoring/*.yaml > "$out/alert-metrics"
"$CRDCHECK" dashboard deploy/grafana/outbox-relay.json > "$out/dashboard-metrics"

# ---- every metric they select is one the relay exports
grep -oE '^pub(\(crate\))? const [A-Z_]+: &str = "outbox_relay_[a-z_]+"' src/ops/metrics.rs \
    | sed -E 's/.*"(outbox_relay_[a-z_]+)"/\1/' | sort -u > "$out/exported"
[ "$(wc -l < "$out/exported")" -ge 10 ] || { say "read too few metric names from src/ops/metrics.rs"; exit 1; }
for what in alert dashboard; do
    unknown=$(sed -E 's/_(bucket|sum|count)$//' "$out/$what-metrics" | sort -u | comm -23 - "$out/exported")
    if [ -n "$unknown" ]; then
        say "the $what queries metrics src/ops/metrics.rs does not define: $(echo $unknown)"
        exit 1
    fi
    say "  $what: $(wc -l < "$out/$what-metrics") metrics, all exported by the relay"
done
say "all deploy objects rendered and valid"
