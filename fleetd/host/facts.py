"""What a host has, read on it: its GPUs' names and memory (NVML), its memory and cores. A Ray
cluster's executor reads it on each node once a life (fleetd.cluster.nodes), so a host's games
are sized by its own GPUs, not the head's (docs/governor.md, Sizing)."""

from __future__ import annotations

import psutil

from fleetd.host.nvml import NvmlReader
from fleetd.host.telemetry import host_cores
from fleetd.store.records import GpuFact, HostFacts


def read_host_facts(reader: NvmlReader | None = None) -> HostFacts:
    """This host's facts. A GPU lost or whose memory reads as nonsense is not one to size by and
    is left out; NVML unavailable (no driver, no GPU) reads as no GPU."""
    reader = reader or NvmlReader()
    try:
        gpus, _, _ = reader.read()
    finally:
        reader.close()
    read = sorted((gpu for gpu in gpus if not gpu.lost and gpu.memory_total_bytes > 0), key=lambda gpu: gpu.index)
    return HostFacts(tuple(GpuFact(gpu.name, gpu.memory_total_bytes) for gpu in read),
                     int(psutil.virtual_memory().total) or None, host_cores())
