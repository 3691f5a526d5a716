"""`python -m workers.model_io import|export`: plain stable-baselines3 models into and out of
fleetd checkpoints.

Run by the daemon in the worker's interpreter, like `workers.catalog`: it loads torch, SB3 and
the env, which the daemon never imports. It prints one JSON object on success; it exits
`REFUSED` with the reason on stderr when the model does not fit.

Import writes the model as a checkpoint with `workers.checkpoint`'s atomic write, then loads
that checkpoint exactly as a resuming worker does: what imports, resumes.
Export copies a checkpoint's model.zip (a plain SB3 zip: `workers.algos`) and its VecNormalize
statistics, checks that the plain SB3 class loads it, and writes how to rebuild the env.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from workers import checkpoint
from workers.bundle import METADATA, MODEL, README, REPLAY_BUFFER, VECNORMALIZE, Staged

REFUSED = 3
FORMAT_VERSION = 1
log = logging.getLogger("workers.model_io")


class Refused(Exception):
    """The model does not fit the env or does not load; the message says which and why."""


def env_config(env_id: str, hp: dict[str, Any], learning_wrappers: bool = True, num_envs: int = 1):
    from workers.envs import EnvConfig

    return EnvConfig(env_id=env_id, num_envs=num_envs, learning_wrappers=learning_wrappers,
                     max_episode_steps=hp.get("max_episode_steps"), frame_stack=hp.get("frame_stack", 4))


# -- import -----------------------------------------------------------------------------------


def import_model(staged: Staged, env_id: str, algo: str, steps: int, hp: dict[str, Any],
                 checkpoint_dir: Path) -> dict[str, Any]:
    from workers.envs import make_vec_env

    # As many envs as the game's runs will have where it pins them: a replay buffer fits only
    # runs of the env count that filled it.
    venv = make_vec_env(env_config(env_id, hp, num_envs=hp.get("num_envs") or 1))
    try:
        check_spaces(staged.model, algo, env_id, venv)
        path = checkpoint.write_checkpoint(checkpoint_dir, steps, 0, lambda tmp: _populate(tmp, staged, steps))
        _check_resumes(path, algo, venv, staged)
    finally:
        venv.close()
    return {"checkpoint": str(path), "steps": steps, "algo": algo}


def check_spaces(model_zip: Path, algo: str, env_id: str, venv: Any) -> None:
    """The model's observation and action spaces against the env as fleetd builds it."""
    from stable_baselines3.common.save_util import load_from_zip_file

    from workers.algos import ALGO_CLASSES

    try:
        data, _, _ = load_from_zip_file(model_zip, device="cpu", load_data=True)
    except Exception as exc:  # noqa: BLE001 - whatever stops SB3 reading it refuses it
        raise Refused(f"{MODEL} does not load with stable-baselines3: {type(exc).__name__}: {exc}") from None
    env = ALGO_CLASSES[algo]._wrap_env(venv, verbose=0)  # channel-last images transposed, as load() does
    for what, ours in (("observation_space", env.observation_space), ("action_space", env.action_space)):
        theirs = data.get(what)
        if theirs != ours:
            raise Refused(f"{what.replace('_', ' ')} does not match: {MODEL} has {theirs}, "
                          f"{env_id} (as fleetd builds it) has {ours}")


def _populate(folder: Path, staged: Staged, steps: int) -> None:
    from workers.counters import Counters
    from workers.snapshot import capture_rng, write_state

    for name, present in ((MODEL, True), (VECNORMALIZE, staged.vecnormalize), (REPLAY_BUFFER, staged.replay_buffer)):
        if present:
            shutil.copyfile(staged.folder / name, folder / name)
    write_state(folder, Counters(steps=steps), capture_rng())


def _check_resumes(path: Path, algo: str, venv: Any, staged: Staged) -> None:
    """Load the new checkpoint as `workers.resume` will; remove it if it does not load. A DQN
    given without its replay buffer resumes as a worker does, collecting a fresh one."""
    from workers.snapshot import load_snapshot

    try:
        restored = load_snapshot(path, algo, venv, "cpu", staged.vecnormalize)
    except Exception as exc:  # noqa: BLE001 - whatever stops a resume refuses the import
        shutil.rmtree(path, ignore_errors=True)
        raise Refused(f"the model does not load as fleetd resumes it: {type(exc).__name__}: {exc}") from None
    if restored.replay_note and staged.replay_buffer:
        shutil.rmtree(path, ignore_errors=True)
        raise Refused(f"{REPLAY_BUFFER}: {restored.replay_note}: pin the game's num_envs to the count that "
                      "filled it (--hp num_envs=N), or import the model without its replay buffer")


# -- export -----------------------------------------------------------------------------------


def export_model(ckpt: Path, game: str, env_id: str, algo: str, hp: dict[str, Any], out: Path) -> dict[str, Any]:
    manifest = checkpoint.read_manifest(ckpt)
    out.mkdir(parents=True)
    shutil.copyfile(ckpt / MODEL, out / MODEL)
    normalize = (ckpt / VECNORMALIZE).is_file()
    if normalize:
        shutil.copyfile(ckpt / VECNORMALIZE, out / VECNORMALIZE)
    spaces = _check_plain_load(out / MODEL, algo)
    meta = {"format": FORMAT_VERSION, "game": game, "env_id": env_id, "algo": algo,
            "sb3_class": f"stable_baselines3.{algo.upper()}", "steps": manifest.steps,
            "episodes": manifest.episodes, "checkpoint": ckpt.name, "exported_at": time.time(),
            "vecnormalize": VECNORMALIZE if normalize else None, **spaces, **env_recipe(env_id, hp)}
    (out / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    (out / README).write_text(readme(meta))
    return meta


def _check_plain_load(model_zip: Path, algo: str) -> dict[str, str]:
    """SB3's own class (not fleetd's subclass) opens it, as it will where fleetd is absent."""
    import stable_baselines3

    model = getattr(stable_baselines3, algo.upper()).load(model_zip, device="cpu")
    return {"observation_space": str(model.observation_space), "action_space": str(model.action_space)}


def env_recipe(env_id: str, hp: dict[str, Any]) -> dict[str, Any]:
    """How to build the env the model was trained on, to play it (no learning wrappers)."""
    from workers.envs import envpool_kwargs, is_ale_id, is_atari_envpool, is_envpool_id

    config = env_config(env_id, hp, learning_wrappers=False)
    if is_envpool_id(env_id):
        kwargs = envpool_kwargs(config)
        kwargs.pop("seed"), kwargs.pop("num_threads")
        atari = is_atari_envpool(env_id)
        wrappers = ([f"EnvPool Atari preprocessing: 84x84 gray, max-pooled frame skip 4, up to 30 no-op "
                     f"starts, {config.frame_stack} frames stacked channels-first; in training also "
                     "episodic_life and reward_clip"] if atari else [])
        return {"env_backend": "envpool", "env_make": "envpool.make_gymnasium", "env_kwargs": kwargs,
                "wrappers": wrappers}
    atari = is_ale_id(env_id)
    cap = (f", a cap of {config.max_episode_steps} agent steps per game (above the frame skip)"
           if config.max_episode_steps else "")
    wrappers = ([f"SB3 AtariWrapper chain: NoopReset(30), MaxAndSkip(4){cap}, FireReset, 84x84 gray "
                 "(area resize); in training also EpisodicLife and ClipReward",
                 f"VecFrameStack(n_stack={config.frame_stack})"] if atari else [])
    # Atari's cap is a wrapper's (workers/envs.py atari_env): gym.make's would count frames.
    kwargs = {"max_episode_steps": config.max_episode_steps} if config.max_episode_steps and not atari else {}
    return {"env_backend": "gymnasium", "env_make": "gymnasium.make", "env_kwargs": kwargs, "wrappers": wrappers}


def readme(meta: dict[str, Any]) -> str:
    cls = meta["algo"].upper()
    lines = [f"# {meta['game']}: {cls} on {meta['env_id']}, {meta['steps']} steps", "",
             f"Exported by fleetd from checkpoint {meta['checkpoint']}. A plain stable-baselines3 zip:",
             "", "```python", f"from stable_baselines3 import {cls}", f'model = {cls}.load("model.zip")', "```", "",
             f"Env: `{meta['env_make']}({meta['env_id']!r}, **env_kwargs)` with env_kwargs "
             f"`{json.dumps(meta['env_kwargs'])}` (from {METADATA})."]
    lines += [f"- {wrapper}" for wrapper in meta["wrappers"]]
    if meta["vecnormalize"]:
        lines += ["", "Observations were normalized: wrap the vectorized env with",
                  f'`VecNormalize.load("{VECNORMALIZE}", venv)`, then set `training = False` and '
                  "`norm_reward = False` to play."]
    return "\n".join(lines) + "\n"


# -- command line -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level="WARNING", stream=sys.stderr)
    args = _parser().parse_args(argv)
    hp = json.loads(args.hyperparams)
    try:
        if args.command == "import":
            staged = Staged(args.folder, (args.folder / VECNORMALIZE).is_file(), (args.folder / REPLAY_BUFFER).is_file())
            result = import_model(staged, args.env_id, args.algo, args.steps, hp, args.checkpoint_dir)
        else:
            result = export_model(args.checkpoint, args.game, args.env_id, args.algo, hp, args.out)
    except Refused as exc:
        print(str(exc), file=sys.stderr)
        return REFUSED
    json.dump(result, sys.stdout)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workers.model_io", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--env-id", required=True)
    common.add_argument("--algo", required=True, choices=("ppo", "dqn", "a2c"))
    common.add_argument("--hyperparams", default="{}", help="the game's hyperparams, JSON")
    into = commands.add_parser("import", parents=[common])
    into.add_argument("--folder", type=Path, required=True, help="the unpacked upload (workers.bundle)")
    into.add_argument("--steps", type=int, required=True)
    into.add_argument("--checkpoint-dir", type=Path, required=True)
    out = commands.add_parser("export", parents=[common])
    out.add_argument("--checkpoint", type=Path, required=True)
    out.add_argument("--game", required=True)
    out.add_argument("--out", type=Path, required=True)
    return parser


if __name__ == "__main__":
    sys.exit(main())
