"""The adapter benchmarks (issue 17). bench/adapter_cost.py: the call-by-call interleave on a fake
clock, the ceiling and per-agent-step arithmetic, and one short real run of both measures on
Breakout. bench/adapter_async.py: its async stepper gives exactly the adapter's results."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from bench.adapter_async import check
from bench.adapter_cost import Count, Interleaved, Tally, add_arguments, interleave, measure_count, summarize


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_runners(clock: FakeClock, seconds: dict[str, float], calls: list[str]):
    def runner(name: str):
        def run(_actions) -> None:
            calls.append(name)
            clock.now += seconds[name]
        return run
    return {name: runner(name) for name in seconds}


def test_runners_take_turns_in_alternating_order_and_each_call_is_timed_alone():
    clock, calls = FakeClock(), []
    runners = fake_runners(clock, {"raw": 1.0, "adapter": 1.25}, calls)

    result = interleave(runners, np.zeros((4, 2)), seconds=20.0, chunk_seconds=4.5, clock=clock,
                        cpu_clock=clock)

    assert result.calls == 9  # 2.25 s a turn: the ninth starts at 18 s
    assert calls[:6] == ["raw", "adapter", "adapter", "raw", "raw", "adapter"]
    assert result.tallies["raw"].wall == pytest.approx(9.0)
    assert result.tallies["adapter"].wall == pytest.approx(11.25)
    assert result.ratio("adapter", "raw") == pytest.approx(0.8)
    assert len(result.tallies["raw"].chunks) == 4  # a chunk closes at the first turn past 4.5 s
    assert result.chunk_ratios("adapter", "raw") == pytest.approx([0.8] * 4)


def test_a_slow_stretch_shows_in_its_own_chunk_and_in_the_total():
    clock, calls = FakeClock(), []
    runners = fake_runners(clock, {"raw": 1.0}, calls)

    def adapter(_actions) -> None:  # 1 s a call for its first four calls, then 2 s
        calls.append("adapter")
        clock.now += 1.0 if calls.count("adapter") <= 4 else 2.0
    runners["adapter"] = adapter

    result = interleave(runners, np.zeros((1, 1)), seconds=14.0, chunk_seconds=4.0, clock=clock, cpu_clock=clock)

    assert result.calls == 6
    assert result.chunk_ratios("adapter", "raw") == [0.5, 1.0, 1.0]
    assert result.ratio("adapter", "raw") == pytest.approx(6.0 / 8.0)


def test_the_ceiling_and_the_per_agent_step_ratio_follow_the_episode_ends():
    tallies = {"raw": Tally(wall=9.0, cpu=9.0, chunks=[9.0]), "adapter": Tally(wall=10.0, cpu=10.0, chunks=[10.0])}
    result = Interleaved(calls=100, tallies=tallies)

    row = summarize(Count(10, 1, "test"), "env-only", result, 10, {"raw": 20, "adapter": 40})

    assert row.ratio == pytest.approx(0.9)
    assert row.ceiling == pytest.approx(1 / 1.04)  # 40 episode ends in 1,000 agent steps
    assert row.per_agent_step == pytest.approx(0.9 * 1000 / 980)  # raw used 980 of its 1,000 actions
    assert row.raw == pytest.approx(1000 / 9.0) and row.adapter == pytest.approx(100.0)


@pytest.mark.e2e
def test_a_short_real_run_measures_both_sides_on_breakout(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--seconds", "1.5", "--rollout-steps", "4", "--rollout-seconds", "1.5",
                              "--chunk-seconds", "0.5", "--warm-up", "0.2"])

    env_only, rollout = measure_count(args, Count(4, 1, "test"))

    for row in (env_only, rollout):
        assert row.raw > 0 and row.adapter > 0 and 0.3 < row.ratio < 3.0
    assert 0.5 < env_only.ceiling <= 1.0 and env_only.per_agent_step >= env_only.ratio
    assert "| 4 (test) | 1 | env-only |" in capsys.readouterr().out


@pytest.mark.e2e
@pytest.mark.parametrize("depth", [2, 4])
def test_the_async_stepper_gives_exactly_the_adapters_steps(depth):
    from workers.envs import EnvConfig

    config = EnvConfig("Breakout-v5", 4, seed=5, num_threads=1)

    assert check(config, depth, steps=300) >= 20  # episode ends compared, terminal observations too


def test_step_pieces_times_each_piece_of_the_worker_step_on_the_main_thread():
    from bench.step_pieces import measure

    pieces, finished, batches = measure("CartPole-v1", num_envs=4, threads=1, steps=40, warmup=5)

    assert set(pieces) == {"EnvPool send", "EnvPool recv", "adapter step", "callback episode scan",
                           "SB3 _update_info_buffer", "truncation scan", "add_env_step",
                           "adapter own (step less send, recv)"}
    # what docs/benchmarks.md says of EnvPool's batches (no copy, no reorder needed), checked on each
    assert batches["full"] > 0 and batches["writeable"] == batches["in send order"] == batches["full"], batches
    assert finished > 0  # CartPole's random episodes end within 40 steps of 4 envs


def test_the_spares_learning_bench_reads_both_curves_at_equal_env_steps(tmp_path, monkeypatch):
    from bench.spares_learning import VARIANTS, table, train

    import tempfile

    monkeypatch.delenv("SB3_LOGDIR", raising=False)  # the suite's own folder for those (conftest)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where SB3's default logger makes one
    curves = {name: {1: train("CartPole-v1", 1, spares, steps=512, every=256, threshold=10.0)}
              for name, spares in VARIANTS.items()}
    assert list(tmp_path.glob("SB3-*")) == []  # the worker's logger (torch keeps its own cache folder there)

    assert all(set(by_seed[1].points) == {256, 512} for by_seed in curves.values()), curves
    assert all(0 < value < 500 for by_seed in curves.values() for value in by_seed[1].points.values())
    lines = table(curves, every=256, steps=512)
    assert lines[0].startswith("| env steps | spares") and len(lines) == 2 + 2 + 1
