"""Which GPU a game's worker runs on, on a host with several: by free memory and the games
already there (docs/governor.md, Multi-GPU hosts).

Pure: given the GPUs NVML sees (index, free memory) and how many live workers each holds, it
names one. The supervisor asks at each spawn, so a restarted game may land elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuRoom:
    index: int  # NVML's index (PCI bus order): what CUDA_VISIBLE_DEVICES names with CUDA_DEVICE_ORDER=PCI_BUS_ID
    free_bytes: int


def choose_gpu(gpus: Sequence[GpuRoom], games_on: Mapping[int, int]) -> int | None:
    """The GPU whose free memory, shared with the games already there and this one, is the
    largest; among equals the one with fewer games, then the lowest index. None: no GPU seen.

    Free memory alone would pile games onto a GPU whose workers have not allocated yet (a
    worker takes seconds to start); the game count alone would ignore another tenant's use."""
    if not gpus:
        return None
    best = max(gpus, key=lambda gpu: (gpu.free_bytes / (games_on.get(gpu.index, 0) + 1), -games_on.get(gpu.index, 0), -gpu.index))
    return best.index
