#!/usr/bin/env bash
# What issue 22 still has to measure on a GPU, sized for a device session of 15 minutes (the
# `device` tool: one call at most 600 s, a machine's start 1-2 minutes, given back after 30 s
# idle). Run on the device machine from this checkout, carrying `.gpu` (built here by
# `.venv/bin/python bench/gpu_carry.py`: the packages the device image lacks, 22 MiB). Several
# stages a call, in the order given:
#
#   fleet          8 Atari games, MPS auto, 15 s warm-up / 30 s window: fleetd, loops, raw EnvPool (~245 s, cap 265 s)
#   fleet-no-mps   the same without MPS                                                          (~245 s, cap 265 s)
#   worker         one worker against the minimal loop at 8, 32, 64 and 256 envs, one round each  (~150 s, cap 200 s)
#   adapter        env only, every core: raw EnvPool, the adapter, the adapter without spares, 64 and 256 envs (~75 s, cap 100 s)
#
# The plan (docs/benchmarks.md, "On a lent device machine"): two calls back to back, then give_back:
#   A: bench/gpu_session.sh fleet fleet-no-mps   timeout_s 590 (the aim compares both sides at their best,
#      with and without MPS, from one run; at worst 265 + 265, each + 15 s to be killed, + ~30 s set-up)
#   B: bench/gpu_session.sh worker               timeout_s 240, or budget_left_s - 20 where less
#   (adapter: where a later call has 130 s left; the worker stage already shows the spares end to end)
#
# Each stage runs under `timeout -s TERM -k 15 CAP`; one that fails or runs out is recorded and
# the next stage still runs. Figures land in $OUT (the device tool brings them back), a
# gpu_fleet.json after each side even when the call is cut off. Before anything it ends what a
# cut-off earlier call left on a still-warm machine (its daemon, workers, MPS). Exits 2 where
# nothing can be measured (no CUDA device, no usable .gpu/site.tgz, an import failing), 1 when
# a stage failed or ran out. DRY_RUN=1: say what would run, run nothing (the tests' check).
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SELF")/.."
PYTHON="${PYTHON:-python3}"
DRY_RUN="${DRY_RUN:-0}"
export PYTHON

# stage -> its cap in seconds (the stage's own timeouts inside are shorter)
declare -A CAP=([fleet]=265 [fleet-no-mps]=265 [worker]=200 [adapter]=100)
START_TIMEOUT_S=180  # gpu_fleet.py: the daemon, the games, the processes to start (and to stop)

usage() { echo "usage: bench/gpu_session.sh STAGE... (stages: fleet fleet-no-mps worker adapter)" >&2; exit 2; }

# One stage, as the capped child runs it.
run_stage() {
  case "$1" in
    fleet)
      "$PYTHON" bench/gpu_fleet.py --counts 8 --warmup-s 15 --window-s 30 --start-timeout-s "$START_TIMEOUT_S" \
        --out "$OUT/fleet-mps" ;;
    fleet-no-mps)
      "$PYTHON" bench/gpu_fleet.py --counts 8 --mps off --warmup-s 15 --window-s 30 \
        --start-timeout-s "$START_TIMEOUT_S" --out "$OUT/fleet-no-mps" ;;
    worker)
      local failed=0 pair n batch steps
      for pair in 8:256 32:512 64:1024 256:2048; do
        n="${pair%%:*}" batch="${pair##*:}"
        steps=$(( 256 * n > 16384 ? 256 * n : 16384 ))
        echo "== PPO on cuda, Breakout-v5, $n envs, batch $batch, one round"
        "$PYTHON" bench/training.py --device cuda --env-id Breakout-v5 --num-envs "$n" --batch-size "$batch" \
          --threads "$(nproc)" --steps "$steps" --rounds 1 --json "$OUT/worker-$n.json" || failed=1
      done
      return "$failed" ;;
    adapter)
      "$PYTHON" bench/throughput.py tiers --env-id Breakout-v5 --counts 64 256 --threads "$(nproc)" --seconds 20 \
        --warm-up 2 --rollout-steps 0 --without-spares | tee "$OUT/adapter.md" ;;
  esac
}

if [[ "${1:-}" == "--one" ]]; then  # internal: bench/gpu_session.sh --one STAGE, under `timeout`
  run_stage "$2"
  exit $?
fi
[[ $# -ge 1 ]] || usage
for stage in "$@"; do [[ -n "${CAP[$stage]:-}" ]] || usage; done
OUT="${OUT:-$(mktemp -d /tmp/fleetd-gpu-session-XXXXXX)}"
export OUT
mkdir -p "$OUT"

# What a cut-off earlier call left on this machine (it stays warm 30 s): the daemons and workers
# of bench/gpu_fleet.py's fleets (setsid: they outlive a killed call), each worker by its process
# group as tests/daemon_harness.py's kill_leftover_workers does, then each MPS control daemon
# whose pipe folder is still there. Found by command line and folder, never by a program's name.
end_leftovers() {
  local pid args pgid dir control ours kind
  ours="$(ps -o pgid= -p $$ 2>/dev/null | tr -d ' ' || true)"
  for kind in daemon worker; do  # the daemons first: none restarts a worker ended after it
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
      [[ "$pid" == "$$" ]] && continue
      args="$(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" || true)"
      if [[ $kind == daemon && "$args" == *" -m fleetd serve --config /tmp/fleetd-"* ]]; then
        echo "bench/gpu_session.sh: ending a leftover daemon, pid $pid: ${args:0:160}" >&2
        [[ "$DRY_RUN" == 1 ]] || kill -KILL "$pid" 2>/dev/null || true
      elif [[ $kind == worker && "$args" == *" --spec "* && ( "$args" == *"/tmp/fleetd-"* || "$args" == *"/tmp/gpu-fleet-"* ) ]]; then
        pgid="$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ' || true)"
        echo "bench/gpu_session.sh: ending a leftover worker, pid $pid (group ${pgid:-?}): ${args:0:160}" >&2
        [[ "$DRY_RUN" == 1 ]] && continue
        if [[ -n "$pgid" && "$pgid" != 0 && "$pgid" != "$ours" ]]; then
          kill -KILL -- "-$pgid" 2>/dev/null || true
        else
          kill -KILL "$pid" 2>/dev/null || true
        fi
      fi
    done
  done
  control="$(command -v nvidia-cuda-mps-control || true)"
  [[ -n "$control" ]] || return 0
  for dir in /tmp/fleetd-*/state/mps/pipe /tmp/gpu-fleet-*/mps/pipe; do
    [[ -d "$dir" ]] || continue
    echo "bench/gpu_session.sh: quit to a leftover MPS control daemon ($dir)" >&2
    [[ "$DRY_RUN" == 1 ]] && continue
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$dir" timeout 10 "$control" >/dev/null 2>&1 || true
    rm -rf "$dir"  # told once: the next call does not ask a daemon that is gone
  done
}
[[ "${LEFTOVERS:-1}" == 0 ]] || end_leftovers  # LEFTOVERS=0: the tests, on a machine shared with other daemons

if [[ "${FLEETD_NO_CARRY:-0}" != 1 && -f .gpu/site.tgz ]]; then  # the carried packages, beside the image's own, if built for this Python
  mkdir -p /tmp/fleetd-site && tar xzf .gpu/site.tgz -C /tmp/fleetd-site
  built="$(cat /tmp/fleetd-site/fleetd-carry-python 2>/dev/null || true)"
  here="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [[ "$built" != "$here" ]]; then
    echo "bench/gpu_session.sh: .gpu/site.tgz is for Python ${built:-?}, $PYTHON is $here: rebuild it here with" \
         "'.venv/bin/python bench/gpu_carry.py --python-version $here' (or set PYTHON); nothing was measured" >&2
    exit 2
  fi
  export PYTHONPATH="/tmp/fleetd-site${PYTHONPATH:+:$PYTHONPATH}"
elif [[ "$DRY_RUN" != 1 && "${FLEETD_NO_CARRY:-0}" != 1 ]]; then
  echo "bench/gpu_session.sh: no .gpu/site.tgz: build it here with '.venv/bin/python bench/gpu_carry.py' and" \
       "carry '.gpu' (FLEETD_NO_CARRY=1 where $PYTHON has every package); nothing was measured" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 HF_HUB_OFFLINE=1

if [[ "$DRY_RUN" == 1 ]]; then
  for stage in "$@"; do echo "would run: timeout -s TERM -k 15 ${CAP[$stage]} $SELF --one $stage"; done
  exit 0
fi
if ! timeout -k 5 30 "$PYTHON" -c "import envpool, stable_baselines3, fleetd.daemon, workers.train"; then
  echo "bench/gpu_session.sh: $PYTHON cannot import what the stages need (see above); nothing was measured" >&2
  exit 2
fi
if ! "$PYTHON" bench/gpu_checks.py preflight; then
  echo "bench/gpu_session.sh: no CUDA GPU usable here (see above); nothing was measured" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

failed=()
for stage in "$@"; do
  echo "== $(date -u +%FT%TZ) stage ${stage} (cap ${CAP[$stage]} s), $(nproc) cores, results in $OUT"
  started=$SECONDS
  code=0
  timeout -s TERM -k 15 "${CAP[$stage]}" bash "$SELF" --one "$stage" || code=$?
  if [[ $code -ne 0 ]]; then
    what="exit $code"; [[ $code -eq 124 || $code -eq 137 ]] && what="ran past its cap of ${CAP[$stage]} s ($code)"
    echo "bench/gpu_session.sh: stage $stage FAILED after $(( SECONDS - started )) s: $what; going on" >&2
    failed+=("$stage: $what")
  else
    echo "== stage $stage done in $(( SECONDS - started )) s"
  fi
done
[[ "${LEFTOVERS:-1}" == 0 ]] || end_leftovers  # a stage killed past its cap may have left its daemon's workers or an MPS
if [[ ${#failed[@]} -gt 0 ]]; then
  printf 'bench/gpu_session.sh: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "bench/gpu_session.sh: stages $* done; figures in $OUT"
