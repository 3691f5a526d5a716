"""What a game's worker is told: its run spec (docs/worker-protocol.md), less the run id."""

from __future__ import annotations

import os

from fleetd.config import Settings
from fleetd.store.records import GameRecord
from fleetd.supervision.seams import Launch
from workers.protocol import PROTOCOL_VERSION


def cpu_allotment(settings: Settings, running_games: int) -> int:
    if settings.worker.cpu_threads:
        return settings.worker.cpu_threads
    return max(1, (os.cpu_count() or 1) // max(1, running_games))


def launch_for(
    game: GameRecord, settings: Settings, running_games: int, tier_defaults: dict[str, int]
) -> Launch:
    worker = settings.worker
    game_dir = settings.game_dir(game.name)
    spec = {
        "version": PROTOCOL_VERSION,
        "game": game.name,
        "env_id": game.env_id,
        "algo": game.algo,
        "total_timesteps": game.total_timesteps,
        "target_episodes": game.target_episodes,
        "hyperparams": game.hyperparams,
        # The governor's tier, scaled to the GPU; explicit hyperparams still win.
        "tier_defaults": tier_defaults,
        "checkpoint_dir": str(game_dir / "checkpoints"),
        "checkpoint_interval_s": game.checkpoint_interval_s or worker.checkpoint_interval_s,
        "checkpoint_interval_steps": worker.checkpoint_interval_steps,
        "keep_checkpoints": worker.keep_checkpoints,
        "progress_socket": str(settings.progress_socket),
        "progress_interval_s": worker.progress_interval_s,
        "cpu_threads": cpu_allotment(settings, running_games),
        "device": worker.device,
        "seed": game.id,
        # Never silently from scratch: the worker refuses when checkpoints exist and none verifies.
        "allow_fresh_start": False,
        "tensorboard_dir": str(game_dir / "tensorboard"),
    }
    return Launch(game.name, game_dir, spec)
