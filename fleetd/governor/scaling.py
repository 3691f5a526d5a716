"""GPU auto-scaling: each game's env count and batch size from the tier and the GPU's memory.

A tier's values are the most a game gets. They were sized for `gpu_reference_gib_per_game` of
GPU memory per game at the tier's full size; a smaller share scales both down (to powers of
two, at least an eighth of the tier's values). A worker that will train on a CPU (no GPU seen,
or `[worker] device = "cpu"`) gets at most 2 envs per CPU thread and a batch of 64.

This module is the one place sizing is decided: the run spec's `tier_defaults` are final, the
worker takes them as given (explicit hyperparams still win, docs/worker-protocol.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetd.config import TierSettings
from workers.protocol.spec import TierDefaults

GIB = 2**30
MIN_SHARE = 1 / 8
CPU_ENVS_PER_THREAD = 2
CPU_MAX_BATCH = 64


@dataclass(frozen=True)
class GpuMemory:
    name: str
    total_bytes: int


@dataclass(frozen=True)
class Scaled:
    num_envs: int
    batch_size: int
    reason: str
    on_gpu: bool = False

    def for_worker(self, device: str, cpu_threads: int) -> TierDefaults:
        """What one worker is told: the values as scaled for the GPU, or capped for a CPU."""
        if self.on_gpu and device != "cpu":
            return TierDefaults(num_envs=self.num_envs, batch_size=self.batch_size)
        num_envs = max(1, min(self.num_envs, CPU_ENVS_PER_THREAD * cpu_threads))
        return TierDefaults(num_envs=num_envs, batch_size=min(self.batch_size, CPU_MAX_BATCH))


def _power_of_two_at_most(value: float) -> int:
    power = 1
    while power * 2 <= value:
        power *= 2
    return power


def scale(tier_name: str, tier: TierSettings, gpu: GpuMemory | None, reference_gib: float) -> Scaled:
    if gpu is None:
        capped = f"capped per worker at {CPU_ENVS_PER_THREAD} envs per CPU thread, batch {CPU_MAX_BATCH}"
        return Scaled(tier.num_envs, tier.batch_size, f"{tier_name} values; no GPU seen: {capped}")
    share_gib = gpu.total_bytes / GIB / tier.games
    factor = min(1.0, share_gib / reference_gib)
    where = f"{gpu.name}, {gpu.total_bytes / GIB:.0f} GiB over {tier.games} games = {share_gib:.1f} GiB each"
    if factor >= 1.0:
        return Scaled(tier.num_envs, tier.batch_size, f"{tier_name} values: {where} (>= {reference_gib:g} GiB)", on_gpu=True)
    factor = max(factor, MIN_SHARE)
    num_envs = max(1, _power_of_two_at_most(tier.num_envs * factor))
    batch = max(32, _power_of_two_at_most(tier.batch_size * factor))
    reason = f"{tier_name} scaled x{factor:.2f}: {where} (< {reference_gib:g} GiB)"
    return Scaled(num_envs, batch, reason, on_gpu=True)
