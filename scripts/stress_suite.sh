#!/usr/bin/env bash
# Run the test suite RUNS times with every core kept busy, and count the passes: the suite must
# hold on a loaded machine (no sleep standing for "enough time", no deadline a busy core misses).
#
#   scripts/stress_suite.sh [-n RUNS] [-c CORES] [-f] [-- PYTEST_ARGS...]
#
#   -n RUNS   how many times to run the suite (default 5)
#   -c CORES  how many cores to keep busy (default: all, `nproc`)
#   -f        each run on a fresh clone of this repo's HEAD, running CI's script (.ci/run: a
#             new venv, the install, ruff, mypy and the README's test command, the real-server
#             tier required); PYTEST_ARGS are then not used
#   PYTEST_ARGS  passed to pytest (default: -q -p no:cacheprovider); e.g. a subset of files
#
# The load is `stress-ng --cpu CORES` when stress-ng is installed (Debian: apt-get install
# stress-ng), else one busy shell loop per core. Each run's output is kept in a log folder; the
# last line says how many runs passed. Exit status 0 only if every run passed.
set -u -o pipefail

runs=5
cores=$(nproc)
fresh=0
while getopts "n:c:fh" option; do
    case $option in
        n) runs=$OPTARG ;;
        c) cores=$OPTARG ;;
        f) fresh=1 ;;
        h) sed -n '2,17p' "$0"; exit 0 ;;
        *) sed -n '2,17p' "$0" >&2; exit 2 ;;
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

if [ "$fresh" -eq 1 ]; then
    suite="CI=true bash .ci/run on a fresh clone of $(git -C "$repo" rev-parse --short HEAD)"
else
    suite="pytest ${pytest_args[*]}"
fi
echo "load: $load; suite: $suite; $runs runs; logs in $logs"
passed=0
for run in $(seq "$runs"); do
    started=$(date +%s)
    if [ "$fresh" -eq 1 ]; then
        # A clone has no venv, no build and no pytest cache: what a new contributor starts from.
        # The test environments under ~/.cache/eagledata-tests are the machine's and are kept.
        clone="$logs/clone-$run"
        command=(bash -c "git clone -q '$repo' '$clone' && cd '$clone' && CI=true bash .ci/run")
    else
        command=(bash -c 'cd "$1" && shift && python -m pytest "$@"' _ "$repo" "${pytest_args[@]}")
    fi
    if "${command[@]}" >"$logs/run-$run.log" 2>&1; then
        passed=$((passed + 1))
        verdict=pass
        [ "$fresh" -eq 1 ] && rm -rf "$clone"
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
