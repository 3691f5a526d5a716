#!/usr/bin/env bash
# What issue 22 still has to measure on a GPU, in stages sized for a device session of 15
# minutes (the `device` tool: one call at most 10 minutes, a machine's start 1-2 minutes).
# Run on the device machine from this checkout, carrying `.gpu` (bench/gpu_carry.py builds it
# here: the packages the device image lacks, 22 MiB):
#
#   bench/gpu_session.sh fleet          # 8 Atari games, MPS auto: fleetd, hand-run loops, raw EnvPool (~6 min)
#   bench/gpu_session.sh fleet-no-mps   # the same without MPS, shorter windows (~5 min)
#   bench/gpu_session.sh worker         # one worker against the minimal loop at 8 and 256 envs (~3 min)
#
# One stage a call, in this order: the first is the like-for-like ratio the issue asks for (the
# DQN loops now do the workers' updates), each stage's figures land in $OUT (the device tool
# brings them back). Exits 2 where no CUDA device is usable, 1 when a stage fails.
set -euo pipefail
cd "$(dirname "$0")/.."
stage="${1:-}"
OUT="${OUT:-$(mktemp -d /tmp/fleetd-gpu-session-XXXXXX)}"
mkdir -p "$OUT"

case "$stage" in
  fleet|fleet-no-mps|worker) ;;
  *) echo "usage: bench/gpu_session.sh fleet|fleet-no-mps|worker" >&2; exit 2 ;;
esac
PYTHON="${PYTHON:-python3}"
if [[ -f .gpu/site.tgz ]]; then  # the carried packages, beside the image's own, if built for this Python
  mkdir -p /tmp/fleetd-site && tar xzf .gpu/site.tgz -C /tmp/fleetd-site
  built="$(cat /tmp/fleetd-site/fleetd-carry-python 2>/dev/null || true)"
  here="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [[ "$built" == "$here" ]]; then
    export PYTHONPATH="/tmp/fleetd-site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "bench/gpu_session.sh: .gpu/site.tgz is for Python ${built:-?}, $PYTHON is $here: not used" >&2
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 HF_HUB_OFFLINE=1
if ! "$PYTHON" bench/gpu_checks.py preflight; then
  echo "bench/gpu_session.sh: no CUDA GPU usable here (see above); nothing was measured" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "== $(date -u +%FT%TZ) stage ${stage}, $(nproc) cores, results in $OUT"

case "$stage" in
  fleet)
    "$PYTHON" bench/gpu_fleet.py --counts 8 --warmup-s 20 --window-s 40 --out "$OUT/fleet-mps" ;;
  fleet-no-mps)
    "$PYTHON" bench/gpu_fleet.py --counts 8 --mps off --warmup-s 15 --window-s 30 --out "$OUT/fleet-no-mps" ;;
  worker)
    for pair in 8:256 256:2048; do
      n="${pair%%:*}" batch="${pair##*:}"
      steps=$(( 256 * n > 16384 ? 256 * n : 16384 ))
      echo "== PPO on cuda, Breakout-v5, $n envs, batch $batch"
      "$PYTHON" bench/training.py --device cuda --env-id Breakout-v5 --num-envs "$n" --batch-size "$batch" \
        --threads "$(nproc)" --steps "$steps" --rounds 2 --json "$OUT/worker-$n.json"
    done ;;
esac
echo "bench/gpu_session.sh: stage $stage done; figures in $OUT"
