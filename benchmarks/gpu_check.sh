#!/usr/bin/env bash
# The GPU check in one command: the tests marked `cuda`, then the speed and scale benchmarks at
# the paper's scale (FMNIST CNN and CIFAR-10 MobileNetV2), printing docs/performance.md's tables.
# Planned to finish within 10 minutes on one H100 or H200.
#
#   bash benchmarks/gpu_check.sh              # on a machine with a GPU
#   bash benchmarks/gpu_check.sh --dry-run    # every step at toy size on the CPU (CI)
#
# PYTHON (default python3) runs everything, from the repository root, with PYTHONPATH=. so
# that a machine without the package installed (but with its dependencies) can run it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.
py=${PYTHON:-python3}

if [ "${1:-}" = "--dry-run" ]; then
  device=cpu
  fmnist=(--clients 2 --samples 16 --rounds 1 --warmup 0)
  cifar=(--clients 2 --samples 8 --rounds 1 --warmup 0)
  scale=(--total 64 --sizes 2 4 --rounds 1)
else
  device=cuda
  fmnist=(--clients 300 --samples 180 --rounds 3 --warmup 1)
  cifar=(--clients 300 --samples 150 --rounds 1 --warmup 1)
  scale=(--rounds 2 --warmup 1)
  "$py" -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'; \
print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
fi

echo "## tests marked cuda"
"$py" -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py

echo "## FMNIST CNN, FedRC, K = 3 (speed.py)"
"$py" benchmarks/speed.py --device "$device" --dataset fmnist --model cnn --algorithm fedrc \
  --models 3 "${fmnist[@]}"

echo "## CIFAR-10 MobileNetV2, FedRC, K = 3 (speed.py)"
"$py" benchmarks/speed.py --device "$device" --dataset cifar10 --model mobilenet_v2 \
  --algorithm fedrc --models 3 "${cifar[@]}"

echo "## 30 / 300 / 3,000 clients on the same data (scale.py)"
"$py" benchmarks/scale.py --device "$device" "${scale[@]}"
