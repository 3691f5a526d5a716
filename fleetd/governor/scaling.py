"""GPU auto-scaling: each game's env count and batch size from the tier and the GPU's memory.

A tier's values are the most a game gets. They were sized for `gpu_reference_gib_per_game` of
GPU memory per game at the tier's full size; a smaller share scales both down (to powers of
two, at least an eighth of the tier's values). Without a GPU the tier values go to the worker,
which keeps them small on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetd.config import TierSettings

GIB = 2**30
MIN_SHARE = 1 / 8


@dataclass(frozen=True)
class GpuMemory:
    name: str
    total_bytes: int


@dataclass(frozen=True)
class Scaled:
    num_envs: int
    batch_size: int
    reason: str

    def tier_defaults(self) -> dict[str, int]:
        return {"num_envs": self.num_envs, "batch_size": self.batch_size}


def _power_of_two_at_most(value: float) -> int:
    power = 1
    while power * 2 <= value:
        power *= 2
    return power


def scale(tier_name: str, tier: TierSettings, gpu: GpuMemory | None, reference_gib: float) -> Scaled:
    if gpu is None:
        return Scaled(tier.num_envs, tier.batch_size, f"{tier_name} tier values; no GPU seen (a CPU worker caps them)")
    share_gib = gpu.total_bytes / GIB / tier.games
    factor = min(1.0, share_gib / reference_gib)
    where = f"{gpu.name}, {gpu.total_bytes / GIB:.0f} GiB over {tier.games} games = {share_gib:.1f} GiB each"
    if factor >= 1.0:
        return Scaled(tier.num_envs, tier.batch_size, f"{tier_name} tier values: {where} (>= {reference_gib:g} GiB)")
    factor = max(factor, MIN_SHARE)
    num_envs = max(1, _power_of_two_at_most(tier.num_envs * factor))
    batch = max(32, _power_of_two_at_most(tier.batch_size * factor))
    reason = f"{tier_name} tier scaled x{factor:.2f}: {where} (< {reference_gib:g} GiB)"
    return Scaled(num_envs, batch, reason)
