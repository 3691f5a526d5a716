#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (issue #16): PPO training throughput on cuda
# (bench/training.py: the worker against a CleanRL-style loop) with NVML readings taken during
# it, the CUDA RNG resume check, and the TF32 settings. No network: it uses this checkout's code
# and an installed venv (PYTHON, else .venv/bin/python, else python3 on PATH).
#
#   bench/gpu.sh                        # CartPole-v1 and Breakout-v5
#   STEPS=20000 ROUNDS=3 bench/gpu.sh   # longer measurements
#   OUT=/some/dir bench/gpu.sh          # also keep the JSON results there
#   ENV_COUNTS="8 32" bench/gpu.sh      # the by-env-count section at these counts only (8 32 64 256)
#
# Exits 2 with a message when no GPU is usable, 1 when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PIP_NO_INDEX=1 HF_HUB_OFFLINE=1  # nothing here may reach the network

PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON="$(command -v python3 || true)"; fi
fi
if [[ -z "$PYTHON" ]] || ! "$PYTHON" -c "import torch, envpool, stable_baselines3, fleetd, workers" 2>/dev/null; then
  echo "bench/gpu.sh: no usable Python: set PYTHON to a venv with fleetd installed (make install)" >&2
  exit 2
fi
if ! "$PYTHON" bench/gpu_checks.py preflight; then
  echo "bench/gpu.sh: FAILED: no CUDA GPU usable here (see above); nothing was measured" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv || true

STEPS="${STEPS:-16384}"
ROUNDS="${ROUNDS:-3}"
OUT="${OUT:-$(mktemp -d /tmp/fleetd-gpu-bench-XXXXXX)}"
mkdir -p "$OUT"
failed=0
echo "== date $(date -u +%FT%TZ), $(nproc) cores, results in $OUT"

echo "== TF32"
"$PYTHON" bench/gpu_checks.py tf32 || failed=1

echo "== CUDA RNG resume"
"$PYTHON" bench/gpu_checks.py rng || failed=1

echo "== PPO training throughput on cuda, CartPole-v1 (NVML sampled during it)"
"$PYTHON" bench/gpu_checks.py nvml -- "$PYTHON" bench/training.py --device cuda --env-id CartPole-v1 \
  --steps "$STEPS" --rounds "$ROUNDS" --json "$OUT/training-cartpole.json" || failed=1

echo "== PPO training throughput on cuda, Breakout-v5 (NVML sampled during it)"
"$PYTHON" bench/gpu_checks.py nvml -- "$PYTHON" bench/training.py --device cuda --env-id Breakout-v5 \
  --steps "$STEPS" --rounds "$ROUNDS" --threads "$(nproc)" --batch-size 256 \
  --json "$OUT/training-breakout.json" || failed=1

# Issue 22 item 4: the worker against the loop at the tiers' env counts (batch as the tier sets
# it), each before the device rollout (--sb3-rollout: SB3's host buffer and update) and after.
declare -A TIER_BATCH=([8]=256 [32]=512 [64]=1024 [256]=2048)
for n in ${ENV_COUNTS:-8 32 64 256}; do
  steps=$(( STEPS > 2 * 128 * n ? STEPS : 2 * 128 * n ))  # two rollouts at least
  for side in after before; do
    extra=(); [[ $side == before ]] && extra=(--sb3-rollout)
    echo "== PPO on cuda, Breakout-v5, $n envs, batch ${TIER_BATCH[$n]:-256}, worker $side the device rollout"
    "$PYTHON" bench/gpu_checks.py nvml -- "$PYTHON" bench/training.py --device cuda --env-id Breakout-v5 \
      --num-envs "$n" --batch-size "${TIER_BATCH[$n]:-256}" --threads "$(nproc)" --steps "$steps" \
      --rounds "$ROUNDS" ${extra[@]+"${extra[@]}"} --json "$OUT/training-breakout-$n-$side.json" || failed=1
  done
done

if [[ $failed -ne 0 ]]; then
  echo "bench/gpu.sh: FAILED: a check above failed" >&2
  exit 1
fi
echo "bench/gpu.sh: all checks passed"
