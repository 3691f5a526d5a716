"""The daemon's side of the run spec: sizing decided once (fleetd/governor/scaling.py), every
field set by launch_for, and a stored game whose spec the worker would refuse."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from fleetd.config import Settings
from fleetd.governor.scaling import GpuMemory, Host, Scaled, scale
from fleetd.states import Desired, State
from fleetd.store.records import GameRecord
from fleetd.supervision.policy import Policy
from fleetd.supervision.process import WorkerProcess
from fleetd.supervision.spec import launch_for
from tests.fakes import FakeClock
from tests.supervision_fakes import FakeLauncher, RecordingSink
from workers.protocol.spec import LaunchSpec, TierDefaults

GIB = 2**30
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def game(hyperparams: dict | None = None) -> GameRecord:
    return GameRecord(
        id=4, name="pong", env_id="CartPole-v1", algo="ppo", desired=Desired.RUNNING, priority=0,
        total_timesteps=10_000, target_episodes=None, checkpoint_interval_s=None,
        hyperparams=hyperparams if hyperparams is not None else {"n_steps": 64}, state=State.STOPPED,
        state_reason=None, state_changed_at=NOW, restarts=0, steps=0, episodes=0,
        episodes_per_hour=None, mean_reward_100=None, best_reward=None, progress_at=None,
        admitted_at=None, created_at=NOW, updated_at=NOW, current_run=None, last_checkpoint=None,
    )  # fmt: skip


def with_worker(settings: Settings, **worker: object) -> Settings:
    return settings.model_copy(update={"worker": settings.worker.model_copy(update=worker)})


def test_a_gpu_worker_gets_the_tier_as_scaled_for_the_gpu(settings: Settings) -> None:
    tier = scale("medium", settings.fleet.tiers["medium"], None, Host(GpuMemory("RTX A5000", 24 * GIB), None), settings.fleet)
    assert tier.for_worker("auto", 1) == TierDefaults(num_envs=64, batch_size=1024)  # nothing measured: its own


@pytest.mark.parametrize(("gpu", "device"), [(None, "auto"), (GpuMemory("H100", 80 * GIB), "cpu")])
def test_a_cpu_worker_gets_two_envs_per_thread_and_batch_64(settings: Settings, gpu, device) -> None:
    host = None if gpu is None else Host(gpu, None)
    tier = scale("light", settings.fleet.tiers["light"], None, host, settings.fleet)
    assert tier.for_worker(device, 3) == TierDefaults(num_envs=6, batch_size=64)
    assert tier.for_worker(device, 64) == TierDefaults(num_envs=32, batch_size=64)  # never above the tier


@pytest.fixture
def on_ray(settings: Settings, tmp_path):
    """`settings` on a Ray cluster with the given `[cluster]` values."""
    from fleetd.config import load_settings

    def make(**cluster: object) -> Settings:
        ray = load_settings(state_dir=tmp_path / "state", cluster={
            "backend": "ray", "address": "127.0.0.1:1", "storage": str(tmp_path / "storage"), **cluster}).cluster
        return settings.model_copy(update={"cluster": ray})
    return make


def test_a_workers_threads_on_a_ray_cluster_are_the_cpus_its_actor_holds_on_its_node(on_ray) -> None:
    # They were the head's cores over the games running: a head of 2 cores gave a worker on a
    # 32-core node 1 torch thread and 1-2 EnvPool threads, whatever num_cpus_per_game held for it.
    from fleetd.host.telemetry import host_cores

    assert launch_for(game(), on_ray(num_cpus_per_game=8), 4, None).spec.cpu_threads == 8
    assert launch_for(game(), on_ray(num_cpus_per_game=0.5), 4, None).spec.cpu_threads == 1  # at least one
    assert launch_for(game(), with_worker(on_ray(num_cpus_per_game=8), cpu_threads=3), 4, None).spec.cpu_threads == 3
    assert launch_for(game(), on_ray(), 1, None).spec.cpu_threads == max(1, host_cores())  # unset: the head's share


def test_envpool_threads_on_a_ray_cluster_are_not_bounded_by_the_heads_cores(settings: Settings, on_ray,
                                                                              monkeypatch) -> None:
    # The head's 2 cores bounded a 16-core node's worker to 8 (its torch threads) whatever the
    # factor: the worker bounds them by its own node's cores (tests/workers/test_worker_train.py).
    monkeypatch.setattr("fleetd.supervision.spec.host_cores", lambda: 2)
    ray = with_worker(on_ray(num_cpus_per_game=8), env_thread_factor=2.0)
    assert launch_for(game(), ray, 4, None).spec.env_threads == 16
    local = with_worker(settings, cpu_threads=8, env_thread_factor=2.0)
    assert launch_for(game(), local, 4, None).spec.env_threads == 8  # on this host, its cores


def test_launch_for_sets_every_field_and_sizes_for_the_worker(settings: Settings) -> None:
    settings = with_worker(settings, cpu_threads=2)
    launch = launch_for(game(), settings, 1, Scaled(32, 512, "light tier values; no GPU seen"))
    assert launch.spec is not None and launch.refused is None
    assert launch.spec.model_fields_set == set(LaunchSpec.model_fields)  # nothing left to a default
    assert launch.spec.tier_defaults == TierDefaults(num_envs=4, batch_size=64)
    assert launch.spec.sizes() == (4, 64) and launch.spec.hyperparams.explicit() == {"n_steps": 64}
    assert launch.spec.with_run(9).run_id == 9


@pytest.mark.parametrize(("cpu_threads", "factor", "expected"), [
    (2, 1.0, 2),  # the core share
    (2, 2.0, 4),  # over it
    (1, 1.5, 2),  # rounded
])
def test_envpool_threads_are_the_core_share_times_the_factor(settings: Settings, monkeypatch,
                                                             cpu_threads: int, factor: float, expected: int) -> None:
    monkeypatch.setattr("fleetd.supervision.spec.host_cores", lambda: 16)
    settings = with_worker(settings, cpu_threads=cpu_threads, env_thread_factor=factor)
    assert launch_for(game(), settings, 1, None).spec.env_threads == expected


def test_envpool_threads_stay_within_the_host_cores_but_never_below_the_share(settings: Settings, monkeypatch) -> None:
    monkeypatch.setattr("fleetd.supervision.spec.host_cores", lambda: 16)
    def env_threads(cpu_threads: int, factor: float) -> int:
        worker = with_worker(settings, cpu_threads=cpu_threads, env_thread_factor=factor)
        return launch_for(game(), worker, 1, None).spec.env_threads

    assert env_threads(6, 4.0) == 16  # 24 over 16 cores
    assert env_threads(32, 2.0) == 32  # an explicit cpu_threads over the cores stays


def test_before_the_governor_a_launch_has_no_tier_values(settings: Settings) -> None:
    launch = launch_for(game(), settings, 1, None)
    assert launch.spec is not None and launch.spec.tier_defaults == TierDefaults()


def test_a_stored_game_the_worker_would_refuse_goes_fatal_unstarted(settings: Settings) -> None:
    """E.g. hyperparameters an older fleetd accepted: no worker is started only to exit 78."""
    launch = launch_for(game({"learing_rate": 0.1}), settings, 1, None)
    assert launch.spec is None and launch.refused is not None
    assert "'hyperparams.learing_rate': unknown hyperparameter" in launch.refused
    launcher, sink = FakeLauncher(), RecordingSink()
    proc = WorkerProcess(launch, Policy(), launcher, FakeClock(), sink)
    proc.start()
    assert proc.state is State.FATAL and "run spec refused" in proc.reason
    assert launcher.spawned == [] and sink.causes() == ["bad_spec"]
