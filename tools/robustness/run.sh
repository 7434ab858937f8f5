#!/usr/bin/env bash
# Runs etcd's robustness suite (tools/robustness) against strata and then
# against the real etcd pinned in tools/go.mod, one after the other, and
# prints each scenario's outcome. Usage, from anywhere in the repository:
#
#   tools/robustness/run.sh [strata|etcd|both] [scenario regexp]
#
# e.g. `make robustness`, or `tools/robustness/run.sh strata 'Etcd.*/ClusterOfSize1'`
# (a go test -run pattern below TestRobustness: levels are separated by /).
# ROBUSTNESS_OUT (default: a new temporary directory) receives the binaries,
# one log per target and the suite's reports (RESULTS_DIR, failures only).
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
which=${1:-both}
scenarios=${2:-}
out=${ROBUSTNESS_OUT:-$(mktemp -d -t strata-robustness.XXXXXX)}
mkdir -p "$out"
case $which in
strata) targets=(strata) ;;
etcd) targets=(etcd) ;;
both) targets=(strata etcd) ;;
*) echo "usage: $0 [strata|etcd|both] [scenario regexp]" >&2; exit 2 ;;
esac

# The suite runs the binary named etcd in --bin-dir.
for t in "${targets[@]}"; do
	mkdir -p "$out/$t/bin"
	case $t in
	strata) go build -C "$root" -o "$out/$t/bin/etcd" ./cmd/strata ;;
	etcd) go build -C "$root/tools" -o "$out/$t/bin/etcd" ./cmd/etcd ;;
	esac
done
# Compile the suite once, so that neither target's run pays for it.
go test -C "$root/tools/robustness" -c -o "$out/robustness.test" .

status=0
for t in "${targets[@]}"; do
	echo "== $t: $out/$t.log"
	# Never in parallel: the scenarios use fixed ports, and the machine is small.
	(cd "$root/tools/robustness" && RESULTS_DIR="$out/$t/results" "$out/robustness.test" \
		-test.v -test.count=1 -test.timeout=60m -test.run "TestRobustness/$scenarios" \
		--bin-dir="$out/$t/bin") >"$out/$t.log" 2>&1 || status=1
	grep -E '^\s+--- (PASS|FAIL|SKIP)|NOTE:' "$out/$t.log" | sed 's/^ *//' | sort -u || true
done
echo "logs and reports: $out"
exit $status
