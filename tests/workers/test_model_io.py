"""`workers.model_io` on plain DQN models, in-process: a model saved without its replay buffer
(SB3's `model.save()` alone, and every DQN export) imports and resumes as a worker resumes it,
with a fresh buffer; a buffer given is kept when the game's runs have the env count that filled it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workers import checkpoint
from workers.bundle import MODEL, REPLAY_BUFFER, Staged
from workers.model_io import Refused, export_model, import_model


@pytest.fixture(scope="module")
def dqn_files(tmp_path_factory) -> tuple[Path, Path, int]:
    """A tiny DQN trained by plain SB3 on 2 CartPole envs: its zip, its replay buffer, its steps."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    folder = tmp_path_factory.mktemp("dqn")
    model = DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2), learning_starts=10, buffer_size=200,
                policy_kwargs={"net_arch": [8]}, seed=1)
    model.learn(64)
    model.save(folder / "dqn.zip")
    model.save_replay_buffer(folder / "buffer.pkl")
    return folder / "dqn.zip", folder / "buffer.pkl", model.num_timesteps


def staged(tmp_path: Path, model: Path, buffer: Path | None = None) -> Staged:
    folder = tmp_path / "upload"
    folder.mkdir()
    shutil.copyfile(model, folder / MODEL)
    if buffer is not None:
        shutil.copyfile(buffer, folder / REPLAY_BUFFER)
    return Staged(folder, False, buffer is not None)


def test_a_dqn_without_its_replay_buffer_imports_and_so_does_its_export(dqn_files, tmp_path):
    # Refused before: "model: replay_buffer.pkl: the checkpoint has no replay buffer", so neither
    # a plain model.save() nor a DQN game's own export (which holds no buffer) could be imported.
    model, _, steps = dqn_files
    done = import_model(staged(tmp_path, model), "CartPole-v1", "dqn", steps, {}, tmp_path / "ckpts")
    ckpt = Path(done["checkpoint"])
    assert done["steps"] == steps and checkpoint.verify(ckpt)[0]
    assert not (ckpt / REPLAY_BUFFER).exists()

    export_model(ckpt, "cart", "CartPole-v1", "dqn", {}, tmp_path / "export")
    again = tmp_path / "again"
    again.mkdir()
    done = import_model(staged(again, tmp_path / "export" / MODEL), "CartPole-v1", "dqn", steps, {},
                        again / "ckpts")
    assert checkpoint.verify(done["checkpoint"])[0]


def test_a_replay_buffer_imports_for_the_env_count_that_filled_it(dqn_files, tmp_path):
    # Refused before whatever the game's num_envs: the check's env had 1 env, the buffer 2.
    model, buffer, steps = dqn_files
    done = import_model(staged(tmp_path, model, buffer), "CartPole-v1", "dqn", steps, {"num_envs": 2},
                        tmp_path / "ckpts")
    assert (Path(done["checkpoint"]) / REPLAY_BUFFER).is_file()

    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(Refused, match=r"replay_buffer.pkl: its replay buffer was filled by 2 envs.*--hp num_envs=N"):
        import_model(staged(other, model, buffer), "CartPole-v1", "dqn", steps, {}, other / "ckpts")
    assert not checkpoint.list_checkpoints(other / "ckpts")  # nothing left of the refused import
