"""What a game's worker is told: its run spec (docs/worker-protocol.md), less the run id."""

from __future__ import annotations

from fleetd.config import Settings
from fleetd.governor.scaling import Scaled
from fleetd.host.telemetry import host_cores
from fleetd.store.records import GameRecord
from fleetd.supervision.seams import Launch
from workers.protocol import PROTOCOL_VERSION
from workers.protocol.spec import LaunchSpec, SpecError, TierDefaults, refusals


def cpu_allotment(settings: Settings, running_games: int) -> int:
    """A worker's torch threads (its EnvPool threads from them: `env_thread_allotment`): `[worker]
    cpu_threads`; on a Ray cluster the CPUs its actor holds on its node (`num_cpus_per_game`), not
    a share of the head's cores; else this host's cores over the running games."""
    if settings.worker.cpu_threads:
        return settings.worker.cpu_threads
    if settings.cluster.backend == "ray" and settings.cluster.num_cpus_per_game:
        return max(1, int(settings.cluster.num_cpus_per_game))
    return max(1, host_cores() // max(1, running_games))


def worker_sizes(settings: Settings, tier: Scaled, running_games: int) -> TierDefaults:
    """What a worker is told of the governor's sizing `tier` with `running_games` games running:
    the values sized for its device, capped on a CPU by its share of the cores (`cpu_allotment`).
    The launches, the snapshot's `worker_tier` and the plan's rungs all take it from here."""
    return tier.for_worker(settings.worker.device, cpu_allotment(settings, running_games))


def env_thread_allotment(settings: Settings, cpu_threads: int) -> int:
    """EnvPool's threads: the torch allotment times `env_thread_factor`, within this host's cores.
    On a Ray cluster this host is the head, not the node the worker runs on: the worker bounds
    them by its own node's cores (`workers.train.env_threads`)."""
    wanted = round(cpu_threads * settings.worker.env_thread_factor)
    if settings.cluster.backend != "ray":
        wanted = min(host_cores(), wanted)
    return max(cpu_threads, wanted)


def launch_for(game: GameRecord, settings: Settings, running_games: int, tier: Scaled | None) -> Launch:
    """The game's launch; a spec the worker would refuse (a stored game that an older fleetd
    accepted) is kept as the refusal, and the game goes FATAL instead of starting."""
    game_dir = settings.game_dir(game.name)
    cpu_threads = cpu_allotment(settings, running_games)
    # The governor's tier, sized for this worker's device; explicit hyperparams still win.
    sizes = worker_sizes(settings, tier, running_games) if tier else TierDefaults()
    try:
        spec = launch_spec(game, settings, cpu_threads, sizes)
    except SpecError as exc:
        return Launch(game.name, game_dir, refused=str(exc))
    return Launch(game.name, game_dir, spec)


def launch_spec(game: GameRecord, settings: Settings, cpu_threads: int, sizes: TierDefaults) -> LaunchSpec:
    worker = settings.worker
    game_dir = settings.game_dir(game.name)
    with refusals(game.algo):
        return LaunchSpec(
            version=PROTOCOL_VERSION,
            game=game.name,
            env_id=game.env_id,
            algo=game.algo,
            total_timesteps=game.total_timesteps,
            target_episodes=game.target_episodes,
            hyperparams=game.hyperparams,
            tier_defaults=sizes,
            checkpoint_dir=str(game_dir / "checkpoints"),
            checkpoint_interval_s=game.checkpoint_interval_s or worker.checkpoint_interval_s,
            checkpoint_interval_steps=worker.checkpoint_interval_steps,
            keep_checkpoints=worker.keep_checkpoints,
            keep_hourly=worker.keep_hourly,
            keep_daily=worker.keep_daily,
            progress_socket=str(settings.progress_socket),
            progress_interval_s=worker.progress_interval_s,
            cpu_threads=cpu_threads,
            env_threads=env_thread_allotment(settings, cpu_threads),
            device=worker.device,
            gpu=None,  # placed at each spawn (Supervisor._place): the free memory then decides
            seed=game.id,
            # Never silently from scratch: the worker refuses when checkpoints exist and none verifies.
            allow_fresh_start=False,
            unsaved_since=None,  # set at each spawn from the game's runs (WorkerProcess._spawn)
            tensorboard_dir=str(game_dir / "tensorboard"),
            # The game's own settings; WorkerProcess scales them after a divergence or a CUDA
            # OOM (fleetd/supervision/remedies.py) for the runs that follow.
            lr_scale=1.0,
            batch_scale=1.0,
            bf16_autocast=worker.bf16_autocast,
            channels_last=worker.channels_last,
        )
