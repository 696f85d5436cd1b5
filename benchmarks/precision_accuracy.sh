#!/usr/bin/env bash
# bf16 against fp32 accuracy on a reduced real FMNIST benchmark: FedAvg and FedRC, 3 training
# seeds each, one benchmark; every run trained and evaluated by the CLI, then `fedrc report` per
# precision (mean ± std over the seeds). Sized for about 15 CPU minutes on one core.
#
#   OMP_NUM_THREADS=1 bash benchmarks/precision_accuracy.sh [FOLDER]   # default: precision-accuracy
#
# PYTHON (default python3) runs this checkout's fedrc (PYTHONPATH) inside FOLDER, so that no
# params.yaml adds settings; FOLDER gets the benchmark (data/), the runs
# (runs/<precision>/<algorithm>-s<seed>/) and report-<precision>/.
set -euo pipefail
PYTHONPATH=$(realpath "$(dirname "$0")/..")
export PYTHONPATH
mkdir -p "${1:-precision-accuracy}"
cd "${1:-precision-accuracy}"
fedrc=("${PYTHON:-python3}" -m fedrc_cli)

[ -f data/manifest.json ] || "${fedrc[@]}" partition --dataset fmnist --clients 30 \
  --samples-per-client 120 --holdout-samples 500 --seed 0 --out data
for algorithm in fedavg fedrc; do
  for seed in 0 1 2; do
    for precision in fp32 bf16; do
      run=runs/$precision/$algorithm-s$seed
      [ -f "$run/eval.json" ] && continue # a finished run (the matrix can be restarted)
      "${fedrc[@]}" train --data data --algorithm "$algorithm" --seed "$seed" \
        --precision "$precision" --rounds 10 --eval-every 5 --batch-size 32 --lr 0.05 \
        --device cpu --out "$run" --overwrite
      "${fedrc[@]}" eval --run "$run"
    done
  done
done
for precision in fp32 bf16; do
  "${fedrc[@]}" report runs/$precision --out report-$precision
done
