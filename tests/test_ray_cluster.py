"""The same fleet on a real Ray cluster on this machine: a head and two worker nodes, each a
`ray start` of its own on ports of its own, with a custom resource naming it (network
namespaces would need root on every machine this runs on; distinct ports do not).

One cluster for the whole module: starting three Ray nodes costs a minute or two on a loaded
2-core machine. The tests run in order and build on each other, as an operator's day would:
CartPole games spread over both nodes; one node's power cut (its whole process tree SIGKILLed)
ends its games as `node_lost` and they train on the other node from their newest checkpoints in
shared storage; the daemon killed and started again adopts the very actors, with no game
running twice.

The head's GCS declares a node dead after 3 missed health checks 1 s apart
(bench/ray_cluster.py FAST_HEALTH_CHECKS; Ray's defaults take 15-20 s).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install 'fleetd[ray]' (make install does)")

from bench.ray_cluster import LocalRayCluster  # noqa: E402
from tests.daemon_harness import SUPERVISION, Daemon, DaemonConfig, cartpole, short_tmp_dir  # noqa: E402

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
GAMES = ("ga", "gb")
TRAINING_S = 240.0  # a worker's start on a node: a Ray worker, then torch and SB3, on 2 loaded cores
# Connecting to the cluster and checking every node's versions starts a Ray worker on each node.
DAEMON_START_S = 180.0


@dataclass
class Fleet:
    cluster: LocalRayCluster
    config: DaemonConfig
    daemons: list[Daemon] = field(default_factory=list)
    victim: str | None = None  # the node whose power was cut

    def start_daemon(self) -> Daemon:
        daemon = Daemon(self.config, log_name=f"daemon-{len(self.daemons)}.log")
        self.daemons.append(daemon)
        daemon.wait_healthy(DAEMON_START_S)
        return daemon

    def footprints(self) -> list[tuple]:
        """The footprints the daemon stored: (env id, GPU bytes, RSS bytes, readings)."""
        import sqlite3

        with sqlite3.connect(f"file:{self.config.state_dir / 'fleetd.db'}?mode=ro", uri=True) as db:
            return db.execute("SELECT env_id, gpu_bytes, rss_bytes, samples FROM footprints").fetchall()

    def hosts(self) -> dict[str, dict]:
        return {host["name"]: host for host in self.daemon.get("/api/v1/hosts").json()["items"]}

    @property
    def daemon(self) -> Daemon:
        return self.daemons[-1]

    def node_of(self, game: str) -> list[str]:
        """The nodes a worker of `game` runs on now (found by the run spec in its command line)."""
        found = []
        for name in list(self.cluster.nodes):
            for pid in self.cluster.node_pids(name):
                try:
                    if spec_game(psutil.Process(pid).cmdline()) == game:
                        found.append(name)
                except psutil.NoSuchProcess:
                    continue
        return found

    def checkpoints(self, game: str) -> list[Path]:
        return sorted((self.config.root / "storage" / "games" / game / "checkpoints").glob("ckpt-*"))

    def wait(self, check, what: str, timeout: float = TRAINING_S):
        deadline = time.monotonic() + timeout
        while not (result := check()):
            if time.monotonic() > deadline:
                raise AssertionError(f"not {what} after {timeout:.0f}s\n{self.daemon.log()[-4000:]}")
            if self.daemon.process.poll() is not None:
                raise AssertionError(f"daemon exited with {self.daemon.process.returncode}:\n{self.daemon.log()[-4000:]}")
            time.sleep(0.5)
        return result

    def training(self, game: str) -> bool:
        state = self.daemon.game(game)
        return state["state"] == "running" and state["steps"] > 0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    root = short_tmp_dir()
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    cluster = LocalRayCluster(root / "cluster", python=sys.executable, env={"PYTHONPATH": pythonpath})
    try:
        # No games on the head: it runs fleetd and the GCS. `fleetd_host_<name>` names each
        # node's host (three Ray nodes share this machine's hostname).
        cluster.start_head(num_cpus=0, resources={"fleetd_host_head": 1})
        cluster.add_node("a", num_cpus=2, resources={"node_a": 1, "fleetd_host_a": 1})
        cluster.add_node("b", num_cpus=2, resources={"node_b": 1, "fleetd_host_b": 1})
        yield cluster
    finally:
        cluster.stop()  # every node's tree, by the pids recorded at its start


@pytest.fixture(scope="module")
def fleet(cluster: LocalRayCluster) -> Iterator[Fleet]:
    root = cluster.root.parent
    config = DaemonConfig(root)
    daemons: list[Daemon] = []
    try:
        config.extra = SUPERVISION + (
            "[cluster]\n"
            'backend = "ray"\n'
            f'address = "{cluster.address}"\n'
            f'storage = "{root / "storage"}"\n'
            "num_cpus_per_game = 1\n"
            'scheduling = "SPREAD"\n'
            "[fleet]\n"
            "footprint_settle_s = 1\n"  # the games' footprints measured on their nodes within the test
            "telemetry_interval_s = 2\n"
        )
        config.set_boot_id("11111111-1111-1111-1111-111111111111")
        config.write()
        fleet = Fleet(cluster, config, daemons)
        fleet.start_daemon()
        yield fleet
    finally:
        for daemon in daemons:
            daemon.ensure_stopped()


def test_games_train_on_the_cluster_spread_over_both_nodes(fleet: Fleet) -> None:
    for game in GAMES:
        response = fleet.daemon.post("/api/v1/games", cartpole(game))
        assert response.status_code == 201, response.text
    for game in GAMES:
        fleet.wait(lambda g=game: fleet.training(g) and fleet.checkpoints(g), f"{game} training with a checkpoint")
    where = {game: fleet.wait(lambda g=game: fleet.node_of(g), f"{game}'s worker found") for game in GAMES}
    assert all(len(nodes) == 1 for nodes in where.values()), where
    assert {nodes[0] for nodes in where.values()} == {"a", "b"}, f"SPREAD put both games on one node: {where}"
    # Each game runs on the host whose own governor admitted it (its home), pinned there.
    hosts = fleet.hosts()
    assert hosts["head"]["governor"] is None  # no CPUs: no games, no governor
    assert {g: [h for h in ("a", "b") if g in hosts[h]["governor"]["games"]] for g in GAMES} == where
    # The API names each game's host (the node its actor told the daemon), and each host its games.
    for game in GAMES:
        fleet.wait(lambda g=game: fleet.daemon.game(g)["host"] == where[g][0], f"{game}'s host in the API")
    assert {name: host["games"] for name, host in fleet.hosts().items()} == {
        "head": [], where["ga"][0]: ["ga"], where["gb"][0]: ["gb"]
    }
    # The run's recorded command line names its actor: how a restarted daemon finds it.
    run = fleet.daemon.runs("ga")[0]
    assert run["cause"] is None and run["log_path"].startswith(str(fleet.config.root / "storage"))
    # Each worker's footprint measured on its node by its actor (no GPU here: RSS only).
    footprints = fleet.wait(lambda: fleet.footprints(), "the games' footprints measured on their nodes", timeout=60)
    assert [(env, gpu) for env, gpu, rss, samples in footprints] == [("CartPole-v1", None)], footprints
    assert footprints[0][2] > 50 * 2**20 and footprints[0][3] >= 1, footprints
    # What each host has was read on its node (the head's too): what its games are sized by.
    facts = fleet.wait(lambda: (f := {n: h["facts"] for n, h in fleet.hosts().items()}) and all(f.values()) and f,
                       "every host's facts read on its node", timeout=60)
    assert {n: (f["gpus"], f["cores"], f["memory_bytes"]) for n, f in facts.items()} == {
        n: ([], os.cpu_count(), psutil.virtual_memory().total) for n in ("head", "a", "b")}


def test_a_nodes_power_cut_moves_its_games_to_the_other_node_from_their_checkpoints(fleet: Fleet) -> None:
    victim = fleet.victim = fleet.node_of("ga")[0]
    survivor = "b" if victim == "a" else "a"
    moved = [g for g in GAMES if fleet.node_of(g) == [victim]]
    stayed = [g for g in GAMES if g not in moved]
    before = {game: fleet.daemon.runs(game)[0]["id"] for game in GAMES}
    newest = {game: int(fleet.checkpoints(game)[-1].name.split("-")[1]) for game in moved}

    fleet.cluster.kill_node(victim)

    for game in moved:
        lost = fleet.wait(lambda g=game: _run(fleet.daemon.runs(g), before[g], "cause"), f"{game}'s run ended")
        assert lost["cause"] == "node_lost", lost
        fleet.wait(lambda g=game: fleet.training(g) and fleet.node_of(g) == [survivor], f"{game} training on {survivor}")
        resumed = fleet.daemon.runs(game)[0]
        assert resumed["id"] > before[game]
        # From its newest checkpoint in shared storage (or one written later, before the cut).
        assert resumed["resumed_from_steps"] is not None and resumed["resumed_from_steps"] >= newest[game], resumed
        fleet.wait(lambda g=game: fleet.daemon.game(g)["host"] == survivor, f"{game}'s host moved to {survivor}")
    for game in stayed:
        run = fleet.daemon.runs(game)[0]
        assert run["id"] == before[game] and run["cause"] is None, run
    events = fleet.daemon.get("/api/v1/events?kind=state&limit=200").json()["items"]
    assert any("node_lost: its cluster node died" in e["message"] for e in events), events


def test_a_restarted_daemon_adopts_the_same_actors_and_no_game_runs_twice(fleet: Fleet) -> None:
    before = {game: fleet.daemon.runs(game)[0] for game in GAMES}
    assert all(run["cause"] is None for run in before.values()), before
    fleet.daemon.kill()  # SIGKILL: no goodbye, the actors train on
    daemon = fleet.start_daemon()
    for game in GAMES:
        run = fleet.wait(lambda g=game: _adopted(daemon.runs(g)), f"{game}'s run adopted")
        assert run["id"] == before[game]["id"] and run["adoptions"] == 1, run
        steps = daemon.game(game)["steps"]
        fleet.wait(lambda g=game, s=steps: daemon.game(g)["steps"] > s, f"{game} reporting to the new daemon")
        assert len(fleet.node_of(game)) == 1, f"{game} runs twice: {fleet.node_of(game)}"
        assert daemon.game(game)["host"] == fleet.node_of(game)[0]
        # Known on its host as a worker spawned there is (a moved slot, a down host, a forget).
        assert f"{game}: its adopted worker (run {run['id']}) runs on host {fleet.node_of(game)[0]}" in daemon.log()
    assert [r for g in GAMES for r in daemon.runs(g) if r["id"] > max(r["id"] for r in before.values())] == []


def test_the_cut_host_rejoins_with_its_downtime_in_its_boot_history(fleet: Fleet) -> None:
    assert fleet.victim is not None
    hosts = fleet.wait(lambda: (h := fleet.hosts()) and not h[fleet.victim]["alive"] and h, f"host {fleet.victim} down")
    assert hosts[fleet.victim]["boots"] == 1
    # The games stop first (each with a final checkpoint, its actor ended): a Ray node must
    # register with the GCS within 30 s of its start, which two trainings on 2 loaded cores
    # can make it miss.
    for game in GAMES:
        assert fleet.daemon.post(f"/api/v1/games/{game}/stop").status_code == 202
    for game in GAMES:
        fleet.wait(lambda g=game: fleet.daemon.game(g)["state"] == "stopped" and not fleet.node_of(g), f"{game} stopped")
    assert [r["cause"] for g in GAMES for r in fleet.daemon.runs(g)[:1]] == ["stopped", "stopped"]
    survivor = "b" if fleet.victim == "a" else "a"
    rungs = {name: h["governor"]["rung"] for name, h in fleet.hosts().items() if h["governor"]}
    assert [fleet.daemon.game(g)["host"] for g in GAMES] == [None, None]
    fleet.cluster.restart_node(fleet.victim)
    host = fleet.wait(lambda: (h := fleet.hosts()[fleet.victim])["boots"] == 2 and h["alive"] and h, "the host back")
    # Its new life is its own reboot, at a rung never proven (windows are 25 min): that host
    # alone steps back, by its own rungs' memory; the other's rung does not move.
    stepped = fleet.wait(lambda: (g := fleet.hosts()[fleet.victim]["governor"])["last_backoff"] and g, "the host's back-off")
    assert "reboot" in stepped["last_backoff"] and stepped["level"] < 4 and stepped["rung"] != rungs[fleet.victim], stepped
    other = fleet.hosts()[survivor]["governor"]
    assert other["rung"] == rungs[survivor] and other["last_backoff"] is None, other
    assert host["downtime_s"] > 0 and host["lives"][1]["downtime_before_s"] == host["downtime_s"], host
    assert host["lives"][0]["ended_at"] is not None
    assert all(h["alive"] and h["boots"] == 1 for name, h in fleet.hosts().items() if name != fleet.victim)
    metrics = httpx.get(fleet.config.url + "/metrics", timeout=10).text
    assert f'fleetd_cluster_host_joins_total{{host="{fleet.victim}"}} 2.0' in metrics
    events = fleet.daemon.get("/api/v1/events?kind=host_lost").json()["items"]
    assert [e["details"]["host"] for e in events] == [fleet.victim]


def test_version_skew_between_the_daemon_and_the_nodes_is_refused_by_name(fleet: Fleet) -> None:
    import ray

    from fleetd.cluster.actors import versions
    from fleetd.cluster.executor import ClusterError, check_nodes

    here = versions()
    ray.init(address=fleet.cluster.address, namespace="skew-test", logging_level="ERROR", log_to_driver=False)
    try:
        check_nodes(here)  # the same versions everywhere: accepted
        with pytest.raises(ClusterError) as caught:
            check_nodes({**here, "fleetd": "0.0.1"})  # as a daemon of another fleetd would
    finally:
        ray.shutdown()
    message = str(caught.value)
    assert message.startswith("version skew between fleetd and the cluster's nodes, refused: ")
    assert message.count(f"fleetd {here['fleetd']} (the daemon has 0.0.1)") == len(fleet.cluster.nodes), message


def _run(runs: list[dict], run_id: int, key: str) -> dict | None:
    run = next((r for r in runs if r["id"] == run_id), None)
    return run if run is not None and run[key] is not None else None


def _adopted(runs: list[dict]) -> dict | None:
    return runs[0] if runs and runs[0]["adoptions"] >= 1 else None


def test_a_url_storage_trains_in_a_node_cache_and_a_crashed_run_resumes_from_the_url(fleet: Fleet) -> None:
    # `[cluster] storage` as an fsspec URL (file:// here: the same fsspec calls as s3://): each
    # run trains in its node's cache, pushes its checkpoints to the URL, and the next run pulls
    # the newest verified one. A daemon of its own on the same cluster, after the first stops.
    fleet.daemon.terminate(60)
    root = fleet.config.root
    url = f"file://{root / 'urlstore'}"
    config = DaemonConfig(root / "url-daemon")
    config.root.mkdir()
    config.extra = fleet.config.extra.replace(f'storage = "{root / "storage"}"', f'storage = "{url}"')
    assert f'storage = "{url}"' in config.extra
    config.set_boot_id("22222222-2222-2222-2222-222222222222")
    config.write()
    fleet.config = config
    daemon = fleet.start_daemon()
    body = cartpole("gu")
    assert daemon.post("/api/v1/games", body).status_code == 201
    at_url = root / "urlstore" / "games" / "gu" / "checkpoints"
    pushed = fleet.wait(lambda: sorted(p for p in at_url.glob("ckpt-*") if (p / "manifest.json").exists()), "a checkpoint at the URL")
    steps = int(pushed[-1].name.split("-")[1])
    worker = next(p for p in worker_processes_of("gu") if p.is_running())
    assert str(root / "urlstore") not in " ".join(worker.cmdline())  # it trains in the node's cache
    worker.kill()
    run = fleet.wait(lambda: (r := daemon.runs("gu")) and len(r) >= 2 and r[0]["resumed_from_steps"] is not None and r[0], "gu resumed")
    assert daemon.runs("gu")[1]["cause"] == "crash"
    assert run["resumed_from_steps"] >= steps, run  # from the URL's checkpoint, on whichever node
    fleet.wait(lambda: fleet.training("gu"), "gu training again")
    # The head mirrors the URL as each run ends: its checkpoint index reads local files.
    assert sorted((config.state_dir / "games" / "gu" / "checkpoints").glob("ckpt-*"))


# -- the executor's own seams on the same cluster: run actors of a stand-in worker ------------------
# A namespace of their own (no daemon of the fleet above sweeps them) and no CPUs asked for (the
# fleet's games may hold the nodes'); each test takes well under 30 s.

STAND_IN = "tests.e2e_workers.crash_after_running"  # reports until SIGTERM, then exits 0


@dataclass
class Executor:
    executor: Any
    settings: Any

    def spawn(self, game: str, run_id: int) -> int:
        from fleetd.supervision.seams import Launch
        from workers.protocol import PROTOCOL_VERSION
        from workers.protocol.spec import LaunchSpec

        game_dir = self.settings.game_dir(game)
        spec = LaunchSpec(version=PROTOCOL_VERSION, game=game, env_id="CartPole-v1", algo="ppo",
                          checkpoint_dir=str(game_dir / "checkpoints"))
        return self.executor.spawn(Launch(game, game_dir, spec=spec), run_id).pid

    def until(self, check, what: str, timeout: float = 60.0) -> list:
        """Waits as the supervisor does, until `check` holds of the happenings seen so far."""
        seen: list = []
        deadline = time.monotonic() + timeout
        while not check(seen):
            if time.monotonic() > deadline:
                raise AssertionError(f"not {what} after {timeout:.0f}s: {seen[-3:]}")
            seen.extend(self.executor.wait(0.5))
        return seen

    def reports(self, handle: int, seen: list) -> list[int]:
        from fleetd.supervision.seams import Reported

        return [h.report.steps for h in seen if isinstance(h, Reported) and h.report.run_id == handle
                and hasattr(h.report, "steps")]

    def exit_of(self, handle: int, seen: list):
        from fleetd.supervision.seams import Exited

        return next((h.status for h in seen if isinstance(h, Exited) and h.pid == handle), None)

    def stop(self, handle: int) -> None:
        self.executor.signal_group(handle, signal.SIGTERM)
        status = self.exit_of(handle, self.until(lambda seen: self.exit_of(handle, seen), f"run {handle} stopped"))
        assert status.code == 0 and status.signal is None, status
        self.executor.signal_group(handle, signal.SIGKILL)  # the supervisor's last word: the actor ends


@pytest.fixture(scope="module")
def executor(cluster: LocalRayCluster) -> Iterator[Executor]:
    import ray

    from fleetd.cluster.actors import report_hub, versions
    from fleetd.cluster.executor import RayExecutor
    from fleetd.config import load_settings

    root = cluster.root.parent / "executor"
    settings = load_settings(state_dir=root / "state", worker={"module": STAND_IN}, cluster={
        "backend": "ray", "address": cluster.address, "storage": str(root / "storage"),
        "namespace": "executor-test", "num_cpus_per_game": 0,
    })  # fmt: skip
    ray.init(address=cluster.address, namespace="executor-test", logging_level="ERROR", log_to_driver=False)
    try:
        ex = RayExecutor(settings, report_hub("executor-test"), versions())
        ex._swept = True  # nothing of this namespace to sweep
        yield Executor(ex, settings)
    finally:
        ray.shutdown()


def test_a_run_outlives_more_daemons_than_its_actor_has_threads(executor: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from fleetd.cluster import executor as executor_module

    monkeypatch.setattr(executor_module, "RUN_WAIT_S", 1.0, raising=False)
    handle = executor.spawn("ta", 1)
    seen = executor.until(lambda seen: executor.reports(handle, seen), "ta reporting")
    run = executor.executor._runs[handle]
    first = run.wait_ref
    seen += executor.until(lambda _: run.wait_ref != first, "the exit asked for again", timeout=10)
    assert executor.exit_of(handle, seen) is None  # a wait that timed out is no ending
    # Each daemon that died left its wait for the exit in the actor, more than it has threads
    # for them (as a daemon before this fix asked: the actor's own bound).
    left = [run.actor.wait.remote() for _ in range(getattr(executor_module, "RUN_THREADS", 8) + 2)]
    time.sleep(1.0)
    started = time.monotonic()
    assert ray.get(run.actor.where.remote(), timeout=5)["pid"]  # a next daemon's probe
    assert ray.get(run.actor.signal.remote(int(signal.SIGTERM)), timeout=5) is True  # a stop, delivered
    assert time.monotonic() - started < 5
    status = executor.exit_of(handle, executor.until(lambda seen: executor.exit_of(handle, seen), "ta stopped"))
    assert status.code == 0 and status.signal is None, status  # its final checkpoint, its own exit
    assert [s["code"] for s in ray.get(left, timeout=10)] == [0] * len(left)
    executor.executor.signal_group(handle, signal.SIGKILL)


def test_a_run_actor_whose_node_has_other_versions_is_a_crash_logged_not_a_lost_node(
    executor: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    ex = executor.executor
    expected = ex._expected
    ex._expected = {**expected, "fleetd": "0.0.1"}  # as a node with another fleetd sees this daemon
    try:
        with caplog.at_level(logging.WARNING, logger="fleetd.cluster.executor"):
            handle = executor.spawn("tskew", 2)
            status = executor.exit_of(handle, executor.until(lambda seen: executor.exit_of(handle, seen), "its end"))
    finally:
        ex._expected = expected
    assert not status.node_lost and status.code is None and status.signal is None, status
    said = [r.getMessage() for r in caplog.records if "run-000002-tskew" in r.getMessage()]
    assert any("its actor could not start: RuntimeError: version skew on node" in m and "(the daemon has 0.0.1)" in m
               for m in said), said
    assert not any("died" in m for m in said), said
    # Where it was is read from the GCS (never located: it never answered), and that node lives.
    run = ex._ended[handle]
    assert run.node_id is None and ex._node_died(run) is False
    assert run.node_id in {n.node_id for n in ex.nodes() if n.alive}, run  # (any node: it asks no CPUs)
    ex.signal_group(handle, signal.SIGKILL)


def test_a_runs_worker_is_measured_on_its_node_by_its_actor(executor: Executor) -> None:
    """Its process tree's RSS as that node's telemetry reads it (no NVML here: no GPU figure), by
    the run's handle, with the node's own sample and its host's name: the footprints of a
    cluster's workers, and its hosts' pressure."""
    import ray

    handle = executor.spawn("tm", 5)
    executor.until(lambda seen: executor.reports(handle, seen), "tm reporting")
    run = executor.executor._runs[handle]
    worker_pid = ray.get(run.actor.where.remote(), timeout=10)["pid"]
    answer = ray.get(run.actor.measure.remote(), timeout=30)
    [process] = answer["snapshot"].processes
    assert answer["pid"] == process.pid == worker_pid and process.gpu_memory_bytes is None, answer
    assert abs(process.rss_bytes - psutil.Process(worker_pid).memory_info().rss) < 64 * 2**20, answer  # its tree: one process
    assert answer["snapshot"].host.memory_total_bytes == psutil.virtual_memory().total  # the node's own sample
    [measured] = executor.executor.measure(timeout_s=30)
    assert (measured.reading.game, measured.reading.pid) == ("tm", handle) and measured.reading.rss_bytes > 10 * 2**20
    assert measured.host in ("head", "a", "b") and measured.gpu_name is None  # named by its node's fleetd_host_ resource
    executor.executor.signal_group(handle, signal.SIGTERM)
    executor.until(lambda seen: executor.exit_of(handle, seen), "tm stopped")
    assert ray.get(run.actor.measure.remote(), timeout=10) is None  # its worker exited
    executor.executor.signal_group(handle, signal.SIGKILL)


def test_each_live_nodes_host_facts_are_read_there_once_and_listed_with_it(executor: Executor) -> None:
    """Read by a task pinned to the node that asks no CPU, never waited for: listed from the
    listing after it answers, and not read again in that node life."""
    ex = executor.executor
    deadline = time.monotonic() + 60
    while not all((listed := [n for n in ex.nodes() if n.alive]) and [n.facts for n in listed]):
        assert time.monotonic() < deadline, listed
        time.sleep(0.5)
    assert {n.facts.cores for n in listed} == {os.cpu_count()} and all(n.facts.gpus == () for n in listed)
    assert not ex._facts._pending
    assert [n.facts for n in ex.nodes() if n.alive] == [n.facts for n in listed]  # kept, not read again


def test_reports_resume_after_the_report_hub_dies_and_its_replacement_is_on_the_head(executor: Executor) -> None:
    import ray

    ex = executor.executor
    handle = executor.spawn("thub", 3)
    seen = executor.until(lambda seen: executor.reports(handle, seen), "thub reporting")
    old = ex._hub
    ray.kill(old, no_restart=True)
    before = max(executor.reports(handle, seen))
    seen = executor.until(lambda seen: [s for s in executor.reports(handle, seen) if s > before], "thub reporting again", 20)
    assert ex._hub._actor_id != old._actor_id
    placed = ray._private.state.actors(actor_id=ex._hub._actor_id.hex())["Address"]["NodeID"]
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
    assert placed == head
    executor.stop(handle)


def test_a_run_actor_of_an_earlier_fleetd_is_adopted_and_waited_on_until_its_exit(executor: Executor) -> None:
    """The documented upgrade (docs/operations.md): the new daemon adopts the run actors the old
    one started, whose `wait` takes no timeout; asking it with one failed the supervision loop."""
    import threading

    import ray

    class EarlierRunActor:  # the interface of fleetd before bounded waits (defined here: pickled by value)
        def __init__(self) -> None:
            self._done = threading.Event()

        def where(self) -> dict:
            return {"node_id": ray.get_runtime_context().get_node_id(), "hostname": "earlier", "pid": 1, "log_path": ""}

        def signal(self, sig: int) -> bool:
            self._done.set()
            return True

        def wait(self) -> dict:
            self._done.wait()
            return {"code": 0, "signal": None}

    ex = executor.executor
    name = "run-000004-tearlier"
    actor = ray.remote(EarlierRunActor).options(name=name, namespace="executor-test", lifetime="detached",
                                                max_restarts=0, max_concurrency=8, num_cpus=0).remote()
    ray.get(actor.where.remote(), timeout=60)
    assert ex.matches(4, 0.0, ("ray-actor", "executor-test", name))
    assert ex.watch(4, False)
    seen: list = []
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:  # its exit is asked for; nothing fails while it runs on
        seen.extend(ex.wait(0.5))
    assert executor.exit_of(4, seen) is None
    ex.signal_group(4, signal.SIGTERM)
    status = executor.exit_of(4, executor.until(lambda seen: executor.exit_of(4, seen), "tearlier's exit", 30))
    assert status.code == 0 and status.signal is None, status
    ex.signal_group(4, signal.SIGKILL)


def spec_game(cmdline: list[str]) -> str | None:
    """The game a worker's command line trains (read from its run spec); None for any other process."""
    if "workers" not in cmdline or "--spec" not in cmdline:
        return None
    try:
        return json.loads(Path(cmdline[cmdline.index("--spec") + 1]).read_text())["game"]
    except (OSError, ValueError, IndexError, KeyError):
        return None


def worker_processes_of(game: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if spec_game(p.info["cmdline"] or []) == game]
