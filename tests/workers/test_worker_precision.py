"""bf16 autocast and channels-last for the CNN policy (workers/precision.py), on CPU: the CNN
runs in bfloat16 with NHWC weights and a tiny Breakout PPO and DQN still train through them,
and a worker run with both options completes. Whether they help is measured on a GPU host only
(bench/gpu_fleet.py --bf16 --channels-last); nothing here claims a gain."""

from __future__ import annotations

import pytest
import torch
from stable_baselines3.common.torch_layers import NatureCNN

from workers.callback import StopFlag
from workers.envs import make_vec_env
from workers.hyperparams import make_plan, select_device
from workers.precision import apply_precision
from workers.protocol.exit_codes import ExitCode
from workers.train import build_model, env_config, run

TINY_ATARI = {"ppo": {"num_envs": 2, "n_steps": 16, "batch_size": 16, "n_epochs": 1},
              "dqn": {"num_envs": 2, "batch_size": 16, "buffer_size": 256, "learning_starts": 16,
                      "train_freq": 4, "gradient_steps": 1}}


def breakout_model(make_spec, algo: str, **options):
    spec = make_spec(env_id="Breakout-v5", algo=algo, device="cpu", hyperparams=TINY_ATARI[algo], **options)
    plan = make_plan(spec, select_device("cpu"))
    return build_model(spec, plan, make_vec_env(env_config(spec, plan)))


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_the_cnn_trains_in_bf16_with_channels_last_weights(make_spec, algo: str) -> None:
    model = breakout_model(make_spec, algo)
    try:
        assert apply_precision(model, bf16_autocast=True, channels_last=True) >= 1
        cnns = [m for m in model.policy.modules() if isinstance(m, NatureCNN)]
        conv = cnns[0].cnn[0]
        assert conv.weight.is_contiguous(memory_format=torch.channels_last) and conv.weight.dtype == torch.float32
        seen: list[torch.dtype] = []
        conv.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
        before = [p.detach().clone() for p in model.policy.parameters()]
        model.learn(64)
        assert seen and set(seen) == {torch.bfloat16}  # every forward of the CNN ran in bf16
        after = list(model.policy.parameters())
        assert all(torch.isfinite(p).all() for p in after)
        assert any(not torch.equal(b, a) for b, a in zip(before, after))  # it trained
        assert all(p.dtype == torch.float32 for p in after)  # the optimizer's parameters stay float32
    finally:
        model.get_env().close()


def test_off_by_default_changes_nothing(make_spec) -> None:
    model = breakout_model(make_spec, "ppo")
    try:
        forward = model.policy.features_extractor.forward
        assert apply_precision(model, bf16_autocast=False, channels_last=False) == 0
        assert model.policy.features_extractor.forward == forward
    finally:
        model.get_env().close()


def test_a_worker_run_with_both_options_completes(make_spec) -> None:
    spec = make_spec(env_id="Breakout-v5", algo="ppo", device="cpu", hyperparams=TINY_ATARI["ppo"],
                     total_timesteps=64, bf16_autocast=True, channels_last=True, allow_fresh_start=True)
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
