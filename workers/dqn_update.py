"""SB3's `DQN.train` with its loss read once an update instead of once a gradient step.

SB3 calls `loss.item()` after every gradient step's forward pass: on a GPU a wait for the
device between the forward and the backward pass, many a vector step with the zoo's sample
reuse (docs/benchmarks.md, "DQN sample reuse"). Here the losses stay tensors until the update
ends and come back in one copy; the samples, gradients, weights and the logged mean are SB3's
(tests/workers/test_dqn_update.py). The replay buffer is still SB3's, sampled on the host.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def train(model, gradient_steps: int, batch_size: int) -> None:
    """`gradient_steps` gradient steps of `batch_size` replay samples, as SB3's `DQN.train`."""
    model.policy.set_training_mode(True)
    model._update_learning_rate(model.policy.optimizer)
    losses = []
    for _ in range(gradient_steps):
        data = model.replay_buffer.sample(batch_size, env=model._vec_normalize_env)
        discounts = data.discounts if data.discounts is not None else model.gamma  # n-step returns
        with torch.no_grad():
            next_q_values, _ = model.q_net_target(data.next_observations).max(dim=1)
            target_q_values = data.rewards + (1 - data.dones) * discounts * next_q_values.reshape(-1, 1)
        current_q_values = torch.gather(model.q_net(data.observations), dim=1, index=data.actions.long())
        loss = F.smooth_l1_loss(current_q_values, target_q_values)
        losses.append(loss.detach())
        model.policy.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.policy.parameters(), model.max_grad_norm)
        model.policy.optimizer.step()
    model._n_updates += gradient_steps
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    # SB3's figure: the mean over float64 of the float32 losses (its list of `.item()` floats)
    host = torch.stack(losses).cpu().numpy().astype(np.float64) if losses else np.empty(0)
    model.logger.record("train/loss", np.mean(host))
