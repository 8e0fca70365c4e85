#!/usr/bin/env bash
# Run the test suite RUNS times with every core kept busy, and count the passes: the suite must
# hold on a loaded machine (no sleep standing for "enough time", no deadline a busy core misses).
#
#   scripts/stress_suite.sh [-n RUNS] [-c CORES] [-- PYTEST_ARGS...]
#
#   -n RUNS   how many times to run the suite (default 5)
#   -c CORES  how many cores to keep busy (default: all, `nproc`)
#   PYTEST_ARGS  passed to pytest (default: -q -p no:cacheprovider); e.g. a subset of files
#
# The load is `stress-ng --cpu CORES` when stress-ng is installed (Debian: apt-get install
# stress-ng), else one busy shell loop per core. Each run's output is kept in a log folder; the
# last line says how many runs passed. Exit status 0 only if every run passed.
set -u -o pipefail

runs=5
cores=$(nproc)
while getopts "n:c:h" option; do
    case $option in
        n) runs=$OPTARG ;;
        c) cores=$OPTARG ;;
        h) sed -n '2,14p' "$0"; exit 0 ;;
        *) sed -n '2,14p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
pytest_args=("$@")
[ ${#pytest_args[@]} -eq 0 ] && pytest_args=(-q -p no:cacheprovider)

repo=$(cd "$(dirname "$0")/.." && pwd)
logs=$(mktemp -d "${TMPDIR:-/tmp}/eagledata-stress.XXXXXX")
load_pids=()

stop_load() {
    for pid in "${load_pids[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${load_pids[@]}"; do
        wait "$pid" 2>/dev/null
    done
    load_pids=()
}
trap stop_load EXIT
trap 'exit 130' INT TERM

if command -v stress-ng >/dev/null 2>&1; then
    stress-ng --cpu "$cores" --quiet &
    load_pids+=($!)
    load="stress-ng --cpu $cores"
else
    for _ in $(seq "$cores"); do
        bash -c 'while :; do :; done' &
        load_pids+=($!)
    done
    load="$cores busy shell loops"
fi

echo "load: $load; suite: pytest ${pytest_args[*]}; $runs runs; logs in $logs"
passed=0
for run in $(seq "$runs"); do
    started=$(date +%s)
    if (cd "$repo" && python -m pytest "${pytest_args[@]}") >"$logs/run-$run.log" 2>&1; then
        passed=$((passed + 1))
        verdict=pass
    else
        verdict=FAIL
    fi
    summary=$(grep -E "(passed|failed|error)" "$logs/run-$run.log" | tail -1)
    echo "run $run: $verdict in $(($(date +%s) - started)) s: $summary"
    if [ "$verdict" = FAIL ]; then
        grep -E "^(FAILED|ERROR) " "$logs/run-$run.log" | sed 's/^/    /'
    fi
done
stop_load
echo "passed $passed of $runs runs under load ($load)"
[ "$passed" -eq "$runs" ]
