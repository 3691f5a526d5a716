"""Worker options for the CNN policy: bf16 autocast and channels-last (`[worker] bf16_autocast`,
`[worker] channels_last`; the run spec's fields of the same names). Both are off by default:
neither is measured to raise throughput yet, and bench/gpu_fleet.py --bf16 --channels-last is
how a GPU host measures them.

They apply to the policy's features extractors (SB3's NatureCNN for images; for vector
observations the flatten, where they change nothing): under bf16 autocast the extractor's
convolutions and linear layer run in bfloat16 and its output is cast back to float32, so the
heads, the losses and the optimizer stay in float32; with channels-last its 4-D weights and its
input are laid out NHWC, the layout tensor cores prefer. Applied to every model a run trains,
fresh or resumed; checkpoints hold the same float32 parameters either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

log = logging.getLogger(__name__)


def apply_precision(model: BaseAlgorithm, bf16_autocast: bool, channels_last: bool) -> int:
    """Applies the options to every features extractor of the model's policy; returns how many."""
    if not (bf16_autocast or channels_last):
        return 0
    extractors = [m for m in model.policy.modules() if isinstance(m, BaseFeaturesExtractor)]
    for extractor in extractors:
        if channels_last:
            extractor.to(memory_format=torch.channels_last)
        extractor.forward = _forward(extractor.forward, bf16_autocast, channels_last, model.device.type)
    log.info("features extractors: %d%s%s", len(extractors), ", bf16 autocast" if bf16_autocast else "",
             ", channels-last" if channels_last else "")
    return len(extractors)


def _forward(forward: Callable[[torch.Tensor], torch.Tensor], bf16: bool, channels_last: bool,
             device_type: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def wrapped(observations: torch.Tensor) -> torch.Tensor:
        if channels_last and observations.dim() == 4:
            observations = observations.contiguous(memory_format=torch.channels_last)
        if not bf16:
            return forward(observations)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return forward(observations).float()

    return wrapped
