"""bench/gpu_fleet.py (issue 22 item 1): without CUDA it exits 2 saying why; its CPU test mode
(CartPole PPO, N = 1 here, a few seconds each) runs the real daemon, the loops and raw EnvPool
and writes the JSON, the PNG and the table; --fault-one's arithmetic is checked on its own. Its figures are not checked for speed: this
machine has no GPU, and what the bench measures on one is in docs/benchmarks.md (GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.fleet_loops import Meter
from bench.gpu_fleet import (SIDES, Options, fault_result, loop_settings, parse, ratio, rung_for, table,
                             wait_until_training)
from workers.phases import PhaseTimer
from tests.bench_run import ROOT, run_bench


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_bench("gpu_fleet.py", *args, timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_it_exits_2_saying_why(tmp_path: Path) -> None:
    done = bench("--out", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no CUDA device" in done.stderr and "NVIDIA GPU" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing measured, nothing written


def test_the_cpu_mode_is_refused_without_its_switch(tmp_path: Path) -> None:
    done = bench("--device", "cpu", "--out", str(tmp_path))
    assert done.returncode == 2 and "--allow-cpu" in done.stderr


def test_each_n_runs_at_the_ladders_rung_for_it() -> None:
    assert (rung_for(1).games, rung_for(1).num_envs) == (1, 32)
    assert (rung_for(2).num_envs, rung_for(2).tier) == (32, "light")
    assert (rung_for(4).num_envs, rung_for(4).tier) == (64, "medium")
    assert (rung_for(8).num_envs, rung_for(8).batch_size, rung_for(8).tier) == (256, 2048, "heavy")
    assert (rung_for(10).games, rung_for(10).num_envs, rung_for(10).tier) == (10, 256, None)  # past the top


def test_the_loops_train_dqn_with_the_workers_updates_not_the_rungs_batch() -> None:
    """The daemon hands a worker the rung's sizes as tier values, and DQN then takes the zoo's
    sample reuse (64 gradient steps of 32 a vector step at 256 Atari envs). The loop must do the
    same work: given the batch as an explicit hyperparameter it would do one step of 2,048."""
    from workers.hyperparams import DeviceInfo, algo_kwargs, make_plan
    from workers.protocol.spec import RunSpec, TierDefaults

    sizes = {"num_envs": 256, "batch_size": 2048}
    loop = loop_settings("Pong-v5", "dqn", sizes, Options(device="cpu"))
    spec = RunSpec(version=1, game="pong", run_id=0, env_id="Pong-v5", algo="dqn", checkpoint_dir="/nonexistent",
                   tier_defaults=TierDefaults(**sizes))
    worker = algo_kwargs("dqn", make_plan(spec, DeviceInfo("cpu", "cpu")), True)
    assert (loop["batch_size"], loop["train_freq"], loop["gradient_steps"]) == (32, 1, 64)
    assert {k: worker[k] for k in ("batch_size", "train_freq", "gradient_steps")} == \
        {k: loop[k] for k in ("batch_size", "train_freq", "gradient_steps")}
    ppo = loop_settings("Breakout-v5", "ppo", sizes, Options(device="cpu"))
    assert ppo["batch_size"] == 2048 and ppo["n_steps"] == 128


def test_the_meter_counts_only_the_window() -> None:
    meter = Meter(start=10.0, seconds=10.0)
    meter.add("collect", 5.0, 15.0, steps=100)  # half inside
    meter.add("update", 15.0, 17.0)
    meter.add("collect", 19.0, 23.0, steps=40)  # a quarter inside
    assert meter.steps == pytest.approx(60.0)
    assert meter.phases == pytest.approx({"collect": 6.0, "update": 2.0})
    assert meter.result()["steps_per_s"] == pytest.approx(6.0)


def test_the_worker_splits_its_time_at_the_rollout_hooks() -> None:
    now = [0.0]
    timer = PhaseTimer(clock=lambda: now[0])
    for collect, update in ((3.0, 1.0), (2.0, 0.5)):
        timer.rollout_start()
        now[0] += collect
        timer.rollout_end()
        now[0] += update
    timer.rollout_start()  # the second update ends here
    assert (timer.collect_s, timer.update_s, timer.rollouts) == (5.0, 1.5, 2)
    assert timer.describe().startswith("time split: collection 5.000 s, updates 1.500 s over 2 rollouts")


def test_quick_keeps_the_counts_it_is_given() -> None:
    assert parse(["--device", "cpu", "--quick"])[0].counts == (1, 2)
    options, allow = parse(["--device", "cpu", "--allow-cpu", "--quick", "--counts", "1", "--fault-one"])
    assert (options.counts, options.fault_one, options.window_s, allow) == ((1,), True, 3.0, True)


def test_fault_one_gives_the_others_steps_per_s_before_and_after_the_kill() -> None:
    steps = [{"a": 0, "b": 0, "v": 0}, {"a": 100, "b": 50, "v": 80}, {"a": 300, "b": 50, "v": 80}]
    after = {"a": {"pid": 11, "state": "running"}, "b": {"pid": 22, "state": "backoff"},
             "v": {"pid": 99, "state": "running"}}
    fault = fault_result("v", steps, [10.0, 20.0, 30.0], {"a": 11, "b": 22, "v": 33}, after)
    assert fault["others"] == {"a": {"before": 10.0, "after": 20.0, "kept_running": True},
                               "b": {"before": 5.0, "after": 0.0, "kept_running": False}}
    assert (fault["others_steps_per_s_before"], fault["others_steps_per_s_after"]) == (15.0, 20.0)
    assert fault["after_over_before"] == pytest.approx(1.333)
    assert fault["others_kept_running"] is False  # b stopped stepping and left `running`
    assert (fault["victim_state_after"], fault["victim_restarted"]) == ("running", True)
    after["v"]["pid"] = None
    assert fault_result("v", steps, [10.0, 20.0, 30.0], {"a": 11, "b": 22, "v": 33}, after)["victim_restarted"] is False


def test_start_timeout_has_a_flag_that_quick_does_not_override() -> None:
    assert parse([])[0].start_timeout_s == 600.0
    assert parse(["--start-timeout-s", "180"])[0].start_timeout_s == 180.0
    assert parse(["--device", "cpu", "--quick", "--start-timeout-s", "30"])[0].start_timeout_s == 30.0


def _game(state: str, steps: int = 0, restarts: int = 0) -> dict:
    return {"state": state, "steps": steps, "restarts": restarts, "state_reason": None, "pid": 1}


def _poll(sequence: dict[str, list[dict]], timeout: float = 600.0) -> tuple[dict | Exception, float]:
    """wait_until_training over scripted states (the last repeats), on a fake clock: what it
    returned or raised, and the seconds it waited."""
    now, calls = [0.0], dict.fromkeys(sequence, 0)

    def read(name: str) -> dict:
        calls[name] += 1
        return sequence[name][min(calls[name], len(sequence[name])) - 1]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    try:
        return wait_until_training(read, lambda: True, list(sequence), timeout, clock=lambda: now[0], sleep=sleep), now[0]
    except RuntimeError as error:
        return error, now[0]


def test_waiting_for_training_returns_once_every_game_steps() -> None:
    games, waited = _poll({"a": [_game("starting"), _game("running", 5)], "b": [_game("running", 0), _game("running", 9)]})
    assert isinstance(games, dict) and games["b"]["steps"] == 9 and waited == 0.5


@pytest.mark.parametrize("bad", [[_game("fatal")], [_game("exited")],
                                 [_game("starting"), _game("backoff"), _game("starting"), _game("backoff")],
                                 [_game("starting", restarts=2)]])
def test_waiting_for_training_fails_at_once_on_a_game_given_up_or_crash_looping(bad: list[dict]) -> None:
    error, waited = _poll({"a": [_game("running", 5)], "b": bad})
    assert isinstance(error, RuntimeError) and "crash-looping" in str(error) and "'b'" in str(error)
    assert waited < 5  # not the 600 s timeout


def test_waiting_for_training_gives_up_at_its_timeout_and_when_the_daemon_is_gone() -> None:
    error, waited = _poll({"a": [_game("starting")]}, timeout=30)
    assert isinstance(error, RuntimeError) and "after 30 s" in str(error) and 30 <= waited <= 31
    with pytest.raises(RuntimeError, match="daemon exited"):
        wait_until_training(lambda name: _game("starting"), lambda: False, ["a"], 600, sleep=lambda s: None)


def test_a_failed_or_missing_side_is_na_in_the_ratios_and_the_table() -> None:
    side = {"total_steps_per_s": 100.0, "per_game": {"a": {"gpu_mem_mib": None}}, "gpu": None, "mps": False,
            "gpu_util_pct": None, "host_cpu_busy_pct": 50.0, "daemon_cpu_cores": 0.1}
    assert ratio(side, {"total_steps_per_s": 50.0}) == 2.0
    assert ratio(side, {"error": "RuntimeError: boom"}) is None and ratio(side, None) is None
    assert ratio({"error": "x"}, side) is None and ratio(side, {"total_steps_per_s": 0}) is None
    result = {"n": 1, "rung": {"num_envs": 2, "batch_size": 64}, "games": [{"num_envs": 2, "batch_size": 64}],
              "fleetd": side, "loops": {"error": "RuntimeError: loops processes failed"},
              "fleetd_over_loops": None, "fleetd_over_raw": None}  # raw: never reached
    report = {"gpu": None, "device": "cpu", "machine": "m", "complete": False, "results": [result],
              "options": {"mps": "auto", "bf16": False, "channels_last": False}}
    rows = [line for line in table(report).splitlines() if line.startswith("| 1 |")]
    assert [cell.strip() for cell in rows[0].split("|")[3:8]] == ["100", "n/a", "n/a", "-", "-"]
    assert "failed: N = 1 loops: RuntimeError" in table(report) and "partial" in table(report)
    report["results"][0] = {"n": 1, "rung": {"num_envs": 2, "batch_size": 64}, "games": None,
                            "fleetd": {"error": "boom"}}
    assert "| 1 | 2 envs x 1, batch 64 | n/a | n/a | n/a |" in table(report)


@pytest.mark.e2e
def test_cpu_mode_writes_json_png_and_table(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    done = bench("--device", "cpu", "--allow-cpu", "--quick", "--counts", "1", "--out", str(tmp_path), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads((tmp_path / "gpu_fleet.json").read_text())
    assert report["device"] == "cpu" and report["gpu"] is None and report["complete"] is True
    assert [r["n"] for r in report["results"]] == [1]  # N = 2 is the same code with two games: 2x the time
    for result in report["results"]:
        names = [g["name"] for g in result["games"]]
        assert names == ["cart-ppo", "cart-dqn"][: result["n"]]
        assert all(g["num_envs"] == 2 and g["batch_size"] == 64 for g in result["games"])  # CPU cap, 1 thread
        for side in SIDES:
            figures = result[side]
            assert set(figures["per_game"]) == set(names)
            assert all(g["steps_per_s"] > 0 and g["rss_mib"] > 10 and g["cpu_cores"] > 0
                       for g in figures["per_game"].values()), figures
            assert figures["total_steps_per_s"] == pytest.approx(
                sum(g["steps_per_s"] for g in figures["per_game"].values()), abs=0.5)
            assert 0 < figures["host_cpu_busy_pct"] <= 100
            assert figures["gpu"] is None and figures["gpu_util_pct"] is None  # NVML: no GPU here
            assert figures["mps"] is False  # a CPU fleet never starts MPS
            assert all(g["gpu_mem_mib"] is None for g in figures["per_game"].values())
        for side in ("fleetd", "loops"):  # raw EnvPool only collects
            shares = [g["collect_share"] for g in result[side]["per_game"].values()]
            assert all(s is not None and 0 < s < 1 for s in shares), (side, shares)
        daemon_cpu = result["fleetd"]["daemon_cpu_cores"]
        assert 0 < daemon_cpu < 0.5 * result["n"], daemon_cpu  # the daemon alone, not its workers
        assert result["loops"]["daemon_cpu_cores"] is None
        assert result["fleetd_over_loops"] > 0 and result["fleetd_over_raw"] > 0
    assert (tmp_path / "gpu_fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "gpu_fleet.md").read_text()
    assert table.startswith("GPU: none (cpu)")
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "rung" not in line] == ["1"]


def test_the_device_carry_is_fleetds_closure_less_the_device_image() -> None:
    from bench.gpu_carry import closure, to_carry

    pins = {pin.split("==")[0] for pin in to_carry(closure())}
    assert {"envpool", "ale-py", "gymnasium", "stable-baselines3", "sqlalchemy", "alembic", "fastapi"} <= pins
    assert not pins & {"torch", "numpy", "psutil", "nvidia-ml-py"}  # the image's own: never shadowed
    assert not any(pin.startswith("envpool-assets-mujoco") for pin in pins)


def test_the_device_carry_keeps_envpool_to_the_families_the_benches_use(tmp_path) -> None:
    from bench.gpu_carry import prune_envpool

    root = tmp_path / "envpool"
    families = ("atari", "classic_control", "mujoco", "vizdoom")
    for family in families:
        (root / family).mkdir(parents=True)
        (root / family / "registration.py").write_text("")
    (root / "__init__.py").write_text("import envpool.entry\n")
    (root / "entry.py").write_text('"""All."""\n\n' + "".join(f"import envpool.{f}.registration  # noqa\n" for f in families))
    assert prune_envpool(tmp_path) == ["mujoco", "vizdoom"]
    assert sorted(p.name for p in root.iterdir()) == ["__init__.py", "atari", "classic_control", "entry.py"]
    assert (root / "entry.py").read_text() == ('"""All."""\n\nimport envpool.atari.registration  # noqa\n'
                                               "import envpool.classic_control.registration  # noqa\n")


SESSION = ROOT / "bench" / "gpu_session.sh"


def session(*stages: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SESSION), *stages], cwd="/", env=os.environ | (env or {}),
                          capture_output=True, text=True, timeout=60)


def test_the_gpu_session_script_parses_and_takes_several_stages_a_call(tmp_path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(SESSION)]).returncode == 0
    # FLEETD_NO_CARRY: a checkout's own .gpu (built for the device's Python) is not this test's.
    def caps(*stages: str) -> list[int]:
        dry = session(*stages, env={"DRY_RUN": "1", "LEFTOVERS": "0", "FLEETD_NO_CARRY": "1", "OUT": str(tmp_path)})
        assert dry.returncode == 0, dry.stderr
        assert [line.split()[-1] for line in dry.stdout.splitlines()] == list(stages)
        return [int(line.split()[7]) for line in dry.stdout.splitlines()]

    assert sum(caps("fleet", "fleet-no-mps")) + 15 * 2 + 30 <= 590  # call A, set-up included, under its timeout_s
    assert sum(caps("worker")) + 15 + 25 <= 240  # call B
    assert sum(caps("adapter")) + 15 + 15 <= 130  # where a later call has the time
    assert session("fleet", "nonsense", env={"DRY_RUN": "1", "LEFTOVERS": "0", "FLEETD_NO_CARRY": "1"}).returncode == 2


def test_a_failed_stage_does_not_stop_the_next_nor_a_failed_env_count_the_other(tmp_path: Path) -> None:
    """A stand-in python: gpu_fleet.py fails, training.py at 8 envs fails; the worker stage still
    runs 32, 64 and 256 envs, and the call exits 1 naming both stages."""
    log, fake = tmp_path / "calls.log", tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n'
                    'case "$*" in *gpu_fleet.py*|*"--num-envs 8 "*) exit 1 ;; esac\nexit 0\n')
    fake.chmod(0o755)
    done = session("fleet", "worker", env={"PYTHON": str(fake), "LEFTOVERS": "0", "FLEETD_NO_CARRY": "1",
                                           "OUT": str(tmp_path / "out")})
    assert done.returncode == 1, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    assert any("bench/gpu_fleet.py --counts 8" in c and "--start-timeout-s 180" in c for c in calls)
    training = [c for c in calls if "bench/training.py" in c]
    assert all("--rounds 1" in c for c in training)
    assert [c.split("--num-envs ")[1].split()[0] for c in training] == ["8", "32", "64", "256"]
    assert "stage fleet FAILED" in done.stderr and "stage worker FAILED" in done.stderr


def test_the_adapter_stage_measures_the_adapter_with_and_without_spares_on_every_core(tmp_path: Path) -> None:
    log, fake = tmp_path / "calls.log", tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\necho "| 256 | row |"\n')
    fake.chmod(0o755)
    done = session("adapter", env={"PYTHON": str(fake), "LEFTOVERS": "0", "FLEETD_NO_CARRY": "1",
                                   "OUT": str(tmp_path / "out")})
    assert done.returncode == 0, done.stdout + done.stderr
    call = [c for c in log.read_text().splitlines() if "bench/throughput.py" in c]
    assert len(call) == 1 and f"--threads {len(os.sched_getaffinity(0))}" in call[0] and "--without-spares" in call[0], call
    assert "| 256 | row |" in (tmp_path / "out" / "adapter.md").read_text()


def test_the_gpu_session_refuses_to_run_without_its_carried_packages(tmp_path: Path) -> None:
    done = session("worker", env={"LEFTOVERS": "0", "OUT": str(tmp_path)})
    assert done.returncode == 2 and "gpu_carry.py" in done.stderr


class _EndsAfter(Meter):
    """A window that ends after `checks` calls of done()."""

    def __init__(self, checks: int) -> None:
        super().__init__(start=0.0, seconds=1e12)
        self.checks = checks

    def done(self) -> bool:
        self.checks -= 1
        return self.checks < 0


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_the_loops_stop_at_the_windows_end_not_an_iteration_later(algo: str) -> None:
    from bench.fleet_loops import Job, LOOPS, make_envs

    settings = loop_settings("CartPole-v1", algo, {"num_envs": 2, "batch_size": 64}, Options(device="cpu"))
    settings |= {"learning_starts": 0, "gradient_steps": 50, "train_freq": 1} if algo == "dqn" else {}
    job = Job(algo, "CartPole-v1", 2, 1, "cpu", settings, 1.0, 0.0, "/nonexistent")
    envs = make_envs(job)
    try:
        loop = LOOPS[algo](envs, job, torch.device("cpu"))
        if algo == "ppo":
            loop.update = lambda: pytest.fail("an update after the window's end")
            meter = _EndsAfter(3)  # three vector steps of the rollout, then the window is over
            loop.iteration(meter)
            assert meter.steps == pytest.approx(2 * 3)
        else:
            while loop.steps < settings["batch_size"]:  # enough in the buffer for a batch
                loop.step()
            calls = []
            loop.gradient_step = lambda: calls.append(1)
            loop.iteration(_EndsAfter(1 + 1 + 5))  # the step, the update's check, five gradient steps
            assert len(calls) == 5
    finally:
        envs.close()


def test_the_device_carry_says_which_python_to_use_where_fleetd_is_not_installed(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-I", "-c", "import sys, runpy; sys.argv = ['gpu_carry.py', '--out', "
                           f"'{tmp_path / 'site.tgz'}']; import importlib.metadata as m; m.distribution = "
                           "lambda name: (_ for _ in ()).throw(m.PackageNotFoundError(name)); "
                           f"runpy.run_path('{ROOT / 'bench' / 'gpu_carry.py'}', run_name='__main__')"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and ".venv/bin/python bench/gpu_carry.py" in done.stderr
    assert not (tmp_path / "site.tgz").exists()


def test_quit_mps_tells_a_live_control_daemon_and_skips_one_that_quit(tmp_path: Path, monkeypatch) -> None:
    """A stand-in control program records its pipe folder and stdin: `quit` goes where the pid
    file names a live process or is missing, not where it names a dead one, nor with no program."""
    from bench import gpu_fleet

    seen, fake = tmp_path / "seen", tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    fake.write_text(f'#!/usr/bin/env bash\necho "$CUDA_MPS_PIPE_DIRECTORY $(cat)" >> {seen}\n')
    fake.chmod(0o755)
    live, dead, bare = (tmp_path / name / "pipe" for name in ("live", "dead", "bare"))
    for pipe in (live, dead, bare):
        pipe.mkdir(parents=True)
    (live / "nvidia-cuda-mps-control.pid").write_text(f"{os.getpid()}\n")
    (dead / "nvidia-cuda-mps-control.pid").write_text("999999999\n")
    monkeypatch.setenv("PATH", str(fake.parent), prepend=os.pathsep)
    for pipe in (live, dead, bare, tmp_path / "gone" / "pipe"):
        gpu_fleet.quit_mps(pipe)
    assert seen.read_text().splitlines() == [f"{live} quit", f"{bare} quit"]
    monkeypatch.setenv("PATH", "/nonexistent")
    gpu_fleet.quit_mps(live)  # no program: nothing to tell, no error
    assert len(seen.read_text().splitlines()) == 2
