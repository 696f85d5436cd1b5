#!/usr/bin/env bash
# The GPU check in one command, within a time budget and in priority order: the tests marked
# `cuda`, the speed rows (docs/performance.md), then the paper-scale FMNIST matrix of
# experiments/fmnist, kept in a results folder; each invocation stops by itself within
# --slice-min (default 9 minutes) and `--continue` goes on where the last one stopped.
# docs/gpu.md has the commands for a GPU machine; benchmarks/gpu_check.py does the work.
#
#   bash benchmarks/gpu_check.sh --budget-min 45 --data-root DIR --pack OUT.tar.gz
#   bash benchmarks/gpu_check.sh --continue --data-root DIR --pack OUT.tar.gz
#   bash benchmarks/gpu_check.sh --dry-run --budget-min 12   # every step at toy size on the CPU
#
# The dry run (CI) runs the check three times into a temporary folder, on FedRC, IFCA and IFCA as
# released × lrs 0.1 and 0.03 × two seeds (the second seed at the lr the first picked, then at
# the other): stopped after 2 trials, continued on the "same machine" (checkpoints resumed) and
# stopped after 2 more, then continued on a "fresh machine" (work folder gone) to the end.
# PYTHON (default python3) runs everything with PYTHONPATH=., so a machine without fedrc
# installed (but with its dependencies) can run it.
set -euo pipefail
py=${PYTHON:-python3}
case $py in /*) ;; */*) py=$PWD/$py ;; esac  # the children run in other folders
cd "$(dirname "$0")/.."
export PYTHONPATH=.
export PYTHON=$py

if [ "${1:-}" != "--dry-run" ]; then
  exec "$py" benchmarks/gpu_check.py "$@"
fi
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dry=(--dry-run --seeds 0 1 --algorithms fedrc ifca --lrs 0.1 0.03 --results "$tmp/results"
     --work "$tmp/work")
"$py" benchmarks/gpu_check.py "${dry[@]}" --stop-after 2 "$@"
echo "## --continue on the same machine"
"$py" benchmarks/gpu_check.py "${dry[@]}" --continue --stop-after 2
echo "## --continue on a fresh machine"
rm -rf "$tmp/work"
"$py" benchmarks/gpu_check.py "${dry[@]}" --continue --require-done --pack "$tmp/last.tar.gz"
tar -tzf "$tmp/last.tar.gz" >"$tmp/packed"
grep -q '^results/report/report.md$' "$tmp/packed"
echo "dry run: every step ran, --continue included"
