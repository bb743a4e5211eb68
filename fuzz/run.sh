#!/bin/sh
# Run every fuzz target for SECONDS each (default 20) on the stable
# toolchain (`-s none`: libFuzzer's coverage guidance without a sanitizer).
# Extra arguments go to libFuzzer, e.g. `fuzz/run.sh 0 -runs=10000000`.
# Exits non-zero when any target finds a crash (kept in fuzz/artifacts/).
#   TARGETS="frame serve_lines" fuzz/run.sh 60
set -eu
cd "$(dirname "$0")"
secs=${1:-20}
[ $# -gt 0 ] && shift
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
targets=${TARGETS:-"frame from_worker to_worker profile_toml serve_config serve_lines jsonrpc_http"}
# Build all first, so the time below is fuzzing time.
if ! out=$(cargo fuzz build -s none --release 2>&1); then
    echo "$out"
    exit 1
fi
failed=""
for t in $targets; do
    # A scratch copy of the seeds: new inputs found stay out of the tree.
    work=$(mktemp -d)
    cp corpus/"$t"/* "$work"/
    log=$(mktemp)
    if [ "$secs" -gt 0 ]; then
        limit="-max_total_time=$secs"
    else
        limit=""
    fi
    if cargo fuzz run -s none --release "$t" "$work" -- $limit -max_len=65536 -timeout=10 -print_final_stats=1 "$@" >"$log" 2>&1; then
        summary=$(grep -E '^Done|stat::(number_of_executed_units|average_exec_per_sec|new_units_added)' "$log" | tr -s ' \n' '  ')
        echo "$t: ok: $summary"
        rm -f "$log"
    else
        echo "$t: FAILED (log: $log)"
        tail -n 30 "$log"
        failed="$failed $t"
    fi
    rm -rf "$work"
done
if [ -n "$failed" ]; then
    echo "crashes in:$failed (inputs in fuzz/artifacts/)"
    exit 1
fi
