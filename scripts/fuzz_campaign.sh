#!/usr/bin/env bash
# The long fuzz campaign recorded in bench/results/fuzz-<date>.json: every target of tests/fuzz for
# WAN_FUZZ_CAMPAIGN_SECONDS (default 600) from its seeds and crash regressions alone (--fresh), two at a
# time under nice 10 (the machine is shared), then the numbers libFuzzer printed as
# {"targets": [{"name", "seconds", "executions", "crashes", ...}], ...}.
#   scripts/fuzz_campaign.sh [OUT.json] [TARGET...]   (default OUT: bench/results/fuzz-<today>.json)
set -euo pipefail
cd "$(dirname "$0")/.."
invocation="$0 $*"
out=${1:-bench/results/fuzz-$(date +%F).json}
shift || true
mkdir -p "$(dirname "$out")"
secs=${WAN_FUZZ_CAMPAIGN_SECONDS:-600}
export WAN_FUZZ_INVOCATION="$invocation (= scripts/fuzz.sh -t $secs -p 2 -n 10 -j 2 --fresh --json $out $*)"
exec ./scripts/fuzz.sh -t "$secs" -p 2 -n 10 -j 2 --fresh --json "$out" "$@"
