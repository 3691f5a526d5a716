"""SB3's `PPO.train` with its figures read once an update instead of five times a minibatch.

SB3 calls `.item()` on the policy, value and entropy losses and the clip fraction, and copies
the approximate KL to the host, for every minibatch: five blocking waits for the device that
keep it from queueing the next minibatch's work. Here those figures stay tensors until the
update ends and come back in one copy; the losses, gradients and weights are SB3's
(tests/workers/test_device_rollout.py). With `target_kl` set, the KL is still read every
minibatch: SB3 decides its early stop there, and so does this.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.type_aliases import RolloutBufferSamples
from stable_baselines3.common.utils import explained_variance

# one row a minibatch, in this order
FIGURES = ("policy_gradient_loss", "clip_fraction", "value_loss", "entropy_loss", "approx_kl", "loss")


class UpdateFigures:
    """The minibatches' figures as device tensors, and where the current epoch began."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []
        self.epoch_start = 0

    def new_epoch(self) -> None:
        self.epoch_start = len(self.rows)

    def to_host(self, values: torch.Tensor, returns: torch.Tensor) -> tuple[np.ndarray, ...]:
        """The update's one blocking copy: every minibatch's figures (minibatches, 6), and the
        rollout's values and returns for the explained variance."""
        rows = torch.stack(self.rows)
        host = torch.cat([rows.flatten(), values.flatten(), returns.flatten()]).cpu().numpy()
        rows_end = rows.numel()
        return (host[:rows_end].reshape(rows.shape), host[rows_end:rows_end + values.numel()],
                host[rows_end + values.numel():])


def train(model) -> None:
    """One PPO update over the rollout in `model.rollout_buffer`, as SB3's `PPO.train`."""
    model.policy.set_training_mode(True)
    model._update_learning_rate(model.policy.optimizer)
    clip_range = model.clip_range(model._current_progress_remaining)
    clip_range_vf = None
    if model.clip_range_vf is not None:
        clip_range_vf = model.clip_range_vf(model._current_progress_remaining)
    figures = UpdateFigures()
    for _ in range(model.n_epochs):
        figures.new_epoch()
        stopped = _epoch(model, clip_range, clip_range_vf, figures)
        model._n_updates += 1
        if stopped:
            break
    _record(model, figures, clip_range, clip_range_vf)


def _epoch(model, clip_range: float, clip_range_vf: float | None, figures: UpdateFigures) -> bool:
    """One pass over the rollout; True when `target_kl` stopped the update."""
    for data in model.rollout_buffer.get(model.batch_size):
        loss, approx_kl = _losses(model, data, clip_range, clip_range_vf, figures)
        if model.target_kl is not None and approx_kl.cpu().numpy() > 1.5 * model.target_kl:
            return True
        model.policy.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.policy.parameters(), model.max_grad_norm)
        model.policy.optimizer.step()
    return False


def _losses(model, data: RolloutBufferSamples, clip_range: float, clip_range_vf: float | None,
            figures: UpdateFigures) -> tuple[torch.Tensor, torch.Tensor]:
    """SB3's clipped surrogate, value and entropy losses for one minibatch, and the KL."""
    actions = data.actions
    if isinstance(model.action_space, spaces.Discrete):
        actions = data.actions.long().flatten()
    values, log_prob, entropy = model.policy.evaluate_actions(data.observations, actions)
    values = values.flatten()
    advantages = data.advantages
    if model.normalize_advantage and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_ratio = log_prob - data.old_log_prob
    ratio = torch.exp(log_ratio)
    policy_loss_1 = advantages * ratio
    policy_loss_2 = advantages * torch.clamp(ratio, 1 - clip_range, 1 + clip_range)
    policy_loss = -torch.min(policy_loss_1, policy_loss_2).mean()
    values_pred = values
    if clip_range_vf is not None:
        values_pred = data.old_values + torch.clamp(values - data.old_values, -clip_range_vf, clip_range_vf)
    value_loss = F.mse_loss(data.returns, values_pred)
    entropy_loss = -torch.mean(-log_prob) if entropy is None else -torch.mean(entropy)
    loss = policy_loss + model.ent_coef * entropy_loss + model.vf_coef * value_loss
    # The logged figures, outside autograd and without recomputing: SB3 builds the clip
    # fraction with grad (graph nodes nobody backpropagates) and computes `log_prob -
    # old_log_prob`, its exp and `ratio - 1` twice. Every minibatch pays this, the loop
    # of bench/training.py does not; the same ops on the same tensors give the same figures.
    with torch.no_grad():
        excess = ratio - 1
        clip_fraction = torch.mean((torch.abs(excess) > clip_range).float())
        approx_kl = torch.mean(excess - log_ratio)
        figures.rows.append(torch.stack([policy_loss, clip_fraction, value_loss, entropy_loss, approx_kl,
                                         loss]))
    return loss, approx_kl


def _record(model, figures: UpdateFigures, clip_range: float, clip_range_vf: float | None) -> None:
    """SB3's logged figures, the same values: means over float64 of the float32 figures (as
    SB3's lists of `.item()` floats), the KL's over float32 (as its list of float32 arrays)."""
    stored = model.rollout_buffer.stored
    rows, values, returns = figures.to_host(stored.values, stored.returns)
    means = {name: np.mean(rows[:, i].astype(np.float64)) for i, name in enumerate(FIGURES)}
    means["approx_kl"] = np.mean(rows[figures.epoch_start:, FIGURES.index("approx_kl")])
    for name in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "clip_fraction"):
        model.logger.record(f"train/{name}", means[name])
    model.logger.record("train/loss", float(rows[-1, FIGURES.index("loss")]))  # the last minibatch's
    model.logger.record("train/explained_variance", explained_variance(values, returns))
    if hasattr(model.policy, "log_std"):
        model.logger.record("train/std", torch.exp(model.policy.log_std).mean().item())
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    model.logger.record("train/clip_range", clip_range)
    if clip_range_vf is not None:
        model.logger.record("train/clip_range_vf", clip_range_vf)
