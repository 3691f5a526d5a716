"""Sizing a GPU host's rungs from measured footprints (issue 22, item 2): the H100 and A100
figures, the tolerance, never lighter than the rung below, host RAM, what is used before anything
is measured, and the readings that count (settled, the supervisor's own worker, the peak kept)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleetd.config import FleetSettings
from fleetd.governor.footprint import FootprintBook, Reading, RunningWorker, need_at, settled_readings
from fleetd.governor.ladder import build_ladder
from fleetd.governor.scaling import GIB, GpuMemory, Host, scale
from fleetd.store.records import FootprintRecord
from tests.fakes import EPOCH

MIB = 2**20
H100 = GpuMemory("NVIDIA H100 80GB HBM3", 81_559 * MIB)  # what NVML reports on an H100 80GB
A100 = GpuMemory("NVIDIA A100-SXM4-40GB", 40_960 * MIB)
HOST_RAM = 256 * GIB
SETTINGS = FleetSettings()
LADDER = build_ladder(SETTINGS.tiers)


def rung_and_below(label: str):
    index = next(i for i, rung in enumerate(LADDER) if rung.label.split(" ")[0] == label)
    return LADDER[index].settings(), LADDER[index - 1].settings()


def footprint(num_envs: int, batch: int, gpu_gib: float | None, rss_gib: float, algo: str = "ppo",
              env_id: str = "Breakout-v5") -> FootprintRecord:
    gpu = None if gpu_gib is None else round(gpu_gib * GIB)
    return FootprintRecord(env_id, algo, num_envs, batch, gpu, round(rss_gib * GIB), 6, "H100", EPOCH)


def host(gpu: GpuMemory, *records: FootprintRecord, memory: int | None = HOST_RAM) -> Host:
    return Host(gpu, memory, {(r.env_id, r.algo, r.num_envs, r.batch_size): r for r in records})


def sized(label: str, on: Host, settings: FleetSettings = SETTINGS):
    rung, below = rung_and_below(label)
    return scale(label, rung, below, on, settings)


# -- the H100 80GB case of the issue ---------------------------------------------------------


def test_h100_heavy_and_8x64_keep_their_values_before_anything_is_measured() -> None:
    """The old rule took 81,559 MiB / 8 games = 9.96 GiB < a made-up 10 GiB a game and halved
    both: 8x256 -> 8x128, and 8x64 -> 8x32, lighter than the 7x64 rung below it."""
    heavy, eight = sized("8x256", host(H100)), sized("8x64", host(H100))
    assert (heavy.num_envs, heavy.batch_size) == (256, 2048)
    assert (eight.num_envs, eight.batch_size) == (64, 1024)
    assert heavy.sizing is not None and heavy.sizing.fits is None and heavy.sizing.need is None
    assert "nothing measured at 256 envs, batch 2048" in heavy.reason and "until measured" in heavy.reason


def test_h100_heavy_and_8x64_keep_their_values_as_measured() -> None:
    """One worker at 8 envs was measured at 1.26-1.40 GiB on an H100; bigger rungs take more."""
    on = host(H100, footprint(256, 2048, 4.1, 3.0), footprint(64, 1024, 1.9, 1.6))
    heavy, eight = sized("8x256", on), sized("8x64", on)
    assert (heavy.num_envs, heavy.batch_size, eight.num_envs, eight.batch_size) == (256, 2048, 64, 1024)
    assert heavy.sizing.fits is True and heavy.on_gpu
    # 8 games x 4.1 GiB x 1.1 = 36.08 GiB of 90% of 79.65 GiB = 71.68 GiB
    assert heavy.sizing.gpu_needed_bytes == pytest.approx(4.1 * GIB * 8 * 1.1, abs=8)
    assert heavy.sizing.gpu_room_bytes == round(81_559 * MIB * 0.9)
    assert "36.08 GiB GPU" in heavy.reason and "room 71.68 GiB GPU" in heavy.reason


# -- an A100 40GB: where a rung does not fit ------------------------------------------------


def test_a100_heavy_that_does_not_fit_gets_the_rung_below_never_lighter() -> None:
    on = host(A100, footprint(256, 2048, 5.0, 3.0))  # 8 x 5.0 x 1.1 = 44 GiB > 36 GiB
    heavy = sized("8x256", on)
    assert (heavy.num_envs, heavy.batch_size) == (192, 2048)  # 8x192, the rung below; not 8x128
    assert heavy.sizing.num_envs == 192 and heavy.sizing.need.num_envs == 256  # covered from above
    assert "its own do not fit" in heavy.reason and "does not fit either" in heavy.reason


def test_a100_heavy_measured_below_at_192_fits_there() -> None:
    on = host(A100, footprint(256, 2048, 5.0, 3.0), footprint(192, 2048, 3.9, 2.5))
    heavy = sized("8x256", on)
    assert (heavy.num_envs, heavy.batch_size) == (192, 2048) and heavy.sizing.fits is True
    assert "the rung below's fits" in heavy.reason


def test_a_rung_whose_rung_below_has_fewer_games_keeps_its_values_when_it_does_not_fit() -> None:
    """8x64 stands over 7x64: 8x48 would run fewer env processes than 7x64 (384 < 448)."""
    eight = sized("8x64", host(A100, footprint(64, 1024, 4.6, 1.0)))  # 8 x 4.6 x 1.1 = 40.5 > 36
    assert (eight.num_envs, eight.batch_size) == (64, 1024) and eight.sizing.fits is False
    assert "nothing lighter is allowed above the rung below" in eight.reason


# -- the tolerance, host RAM, several GPUs ---------------------------------------------------


@pytest.mark.parametrize(("tolerance", "envs"), [(0.0, 256), (0.10, 192)])
def test_the_tolerance_decides_a_rung_at_the_edge(tolerance: float, envs: int) -> None:
    edge = 40_960 * MIB * 0.9 / 8 / GIB  # exactly the room of one game of 8 on an A100 40GB
    settings = FleetSettings(footprint_tolerance=tolerance)
    assert sized("8x256", host(A100, footprint(256, 2048, edge, 1.0)), settings).num_envs == envs


def test_host_ram_counts_too() -> None:
    """An Atari DQN's replay buffer lives in host memory (about 5.6 GB at 100,000 frames)."""
    dqn = footprint(256, 2048, 2.0, 7.0, algo="dqn")  # 8 x 7 x 1.1 = 61.6 GiB > 90% of 64 GiB
    assert sized("8x256", host(H100, dqn, memory=64 * GIB)).num_envs == 192
    assert sized("8x256", host(H100, dqn, memory=128 * GIB)).num_envs == 256


def test_games_spread_over_several_gpus() -> None:
    two = GpuMemory(A100.name, A100.total_bytes, count=2)
    heavy = sized("8x256", host(two, footprint(256, 2048, 5.0, 3.0)))  # 4 games a GPU: 22 GiB
    assert heavy.num_envs == 256 and heavy.sizing.games_per_gpu == 4


def test_host_ram_holds_every_game_whatever_the_gpus() -> None:
    """The GPUs share the games out; the host's memory holds all of them: 8 DQN games at 7 GiB
    RSS take 61.6 GiB of a 64 GiB host (57.6 GiB room) on one GPU or eight."""
    dqn = footprint(256, 2048, 2.0, 7.0, algo="dqn")
    eight = GpuMemory(H100.name, H100.total_bytes, count=8)
    scaled = sized("8x256", host(eight, dqn, memory=64 * GIB))
    own = scaled.sizing
    assert scaled.num_envs == 192 and own is not None and "8 games x 1.1" in scaled.reason
    assert sized("8x256", host(eight, dqn, memory=128 * GIB)).num_envs == 256
    fits = sized("8x256", host(eight, dqn, memory=128 * GIB)).sizing
    assert fits is not None and (fits.games_per_gpu, fits.games) == (1, 8)
    assert fits.host_needed_bytes == round(8 * 7 * GIB * 1.1) and fits.gpu_needed_bytes == round(2 * GIB * 1.1)
    assert "1 game a GPU x 1.1 = 2.20 GiB GPU, 8 games x 1.1 = 61.60 GiB host" in fits.figures()


def test_without_a_gpu_the_cpu_caps_hold() -> None:
    rung, below = rung_and_below("8x256")
    scaled = scale("heavy tier", rung, below, None, SETTINGS)
    assert not scaled.on_gpu and scaled.sizing is None and "no GPU seen" in scaled.reason


def test_a_worker_on_the_cpu_of_a_gpu_host_is_told_why_its_values_are_capped() -> None:
    # [worker] device = "cpu" on a GPU host: the worker's 2 envs, batch 64 beside the GPU sizing's
    # reason alone ("... until measured, the rung's own values"), which named other figures.
    scaled = sized("8x256", host(H100))
    worker = scaled.for_worker("cpu", 1)
    assert (worker.num_envs, worker.batch_size) == (2, 64)
    assert scaled.reason_for(worker).startswith(scaled.reason + "; a worker on the CPU ([worker] device = \"cpu\") "
                                                "takes 2 envs, batch 64: capped at 2 envs per CPU thread, batch 64")
    assert scaled.reason_for(scaled.for_worker("cuda", 1)) == scaled.reason  # on the GPU: as sized
    no_gpu = scale("heavy tier", *rung_and_below("8x256"), None, SETTINGS)
    assert no_gpu.reason_for(no_gpu.for_worker("cpu", 1)) == no_gpu.reason  # which says the cap already


def test_the_figures_do_not_change_what_a_worker_is_given() -> None:
    """A new reading changes the figures, not the values: no game restarts for it."""
    first = sized("8x256", host(H100, footprint(256, 2048, 4.1, 3.0)))
    second = sized("8x256", host(H100, footprint(256, 2048, 4.2, 3.0)))
    assert first == second and first.sizing != second.sizing


# -- what is measured ----------------------------------------------------------------------------


def test_need_takes_each_figures_largest_over_the_kinds_at_the_sizes() -> None:
    table = host(H100, footprint(64, 1024, 1.9, 1.6), footprint(64, 1024, 1.2, 5.8, algo="dqn", env_id="Pong-v5"),
                 footprint(8, 256, 1.3, 1.0)).footprints  # fmt: skip
    need = need_at(table, 64, 1024)
    assert need is not None and (need.gpu_bytes, need.rss_bytes) == (round(1.9 * GIB), round(5.8 * GIB))
    assert need.kinds == ("dqn Pong-v5", "ppo Breakout-v5") and need.samples == 12
    assert need_at(table, 128, 1024) is None  # nothing at or above: not guessed from 64


def worker(running_s: float, pid: int = 41, envs: int = 64) -> RunningWorker:
    return RunningWorker(pid, "Breakout-v5", "ppo", envs, 1024, running_s)


def test_a_reading_counts_once_its_worker_has_settled_and_is_the_supervisors_own() -> None:
    readings = [Reading("breakout", 41, 2 * GIB, GIB), Reading("pong", 52, GIB, GIB), Reading("mspacman", 63, GIB, GIB)]
    running = {"breakout": worker(120.0), "pong": worker(119.9, pid=52), "mspacman": worker(500.0, pid=64)}
    counted = settled_readings(readings, running, settle_s=120.0)
    assert [(w.pid, r.game) for w, r in counted] == [(41, "breakout")]


def test_the_book_keeps_each_kinds_peak() -> None:
    book = FootprintBook()
    now = EPOCH
    first = book.add([(worker(200.0), Reading("breakout", 41, 3 * GIB, 2 * GIB))], "H100", now)
    later = now + timedelta(seconds=10)
    (second,) = book.add([(worker(210.0), Reading("breakout", 41, 2 * GIB, None))], None, later)
    assert first[0].samples == 1 and second.samples == 2
    assert (second.gpu_bytes, second.rss_bytes, second.gpu_name, second.measured_at) == (2 * GIB, 3 * GIB, "H100", later)
    assert book.table[("Breakout-v5", "ppo", 64, 1024)] == second
