#!/usr/bin/env bash
# Run every benchmark (medians of 3) and write bench/out/*.json; tables go to stdout
# and to bench/out/run_all.log. One bench at a time: the machine has 2 cores and the
# workers, the driver and Postgres share them.
#
#   bench/run_all.sh                 # everything, both dialects
#   bench/run_all.sh drain latency   # only these benches
#   REPEATS=1 bench/run_all.sh       # a quicker pass
#   BENCH_PG_DSN=postgresql://postgres@127.0.0.1:5432/postgres bench/run_all.sh
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
    # shellcheck disable=SC1091
    . .venv/bin/activate
fi

REPEATS="${REPEATS:-3}"
# Before each run, wait up to this many seconds for the machine to be at most
# BENCH_QUIET_BUSY busy (0..1) from other jobs; the reading is saved with each run.
export BENCH_QUIET_WAIT_S="${BENCH_QUIET_WAIT_S:-45}"
export BENCH_QUIET_BUSY="${BENCH_QUIET_BUSY:-0.25}"
mkdir -p bench/out
log=bench/out/run_all.log
benches=("$@")
if [[ ${#benches[@]} -eq 0 ]]; then
    benches=(submit drain latency memory)
fi

run() {
    echo "=== $* ===" | tee -a "$log"
    # Each bench is bounded on its own; this is a last-resort ceiling.
    timeout --signal=TERM --kill-after=30 10800 python -m "$@" 2>&1 | tee -a "$log" ||
        echo "!!! $1 failed; continuing" | tee -a "$log"
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "nproc: $(nproc)"
    free -h
    python --version
    python -c 'import sqlite3; print("sqlite", sqlite3.sqlite_version)'
    psql "${BENCH_PG_DSN:-postgresql://postgres@127.0.0.1:5432/postgres}" -tAc 'select version()' || true
} | tee -a "$log"

for bench in "${benches[@]}"; do
    case "$bench" in
    submit | drain | latency) run "bench.$bench" --repeats "$REPEATS" ;;
    memory) run bench.memory ;;
    *) echo "unknown bench: $bench (submit, drain, latency, memory)" >&2 && exit 2 ;;
    esac
done
echo "done; JSON in bench/out/" | tee -a "$log"
