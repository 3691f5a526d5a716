"""The Ray backend's error handling, with stand-in actor handles and no cluster: what the run
actor's relay and the executor's exit watch do with each error Ray raises. (A real cluster:
tests/test_ray_cluster.py.)"""

from __future__ import annotations

import logging
import socket
from collections import deque
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install 'fleetd[ray]' (make install does)")

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError  # noqa: E402

from fleetd.cluster import actors as actors_module  # noqa: E402
from fleetd.cluster import executor as executor_module  # noqa: E402
from fleetd.cluster.actors import RunActor  # noqa: E402
from fleetd.cluster.executor import RayExecutor, _Run  # noqa: E402
from fleetd.config import load_settings  # noqa: E402


PENDING = object()  # an outcome: the call is under way (not ready)
BLOCKED: list[float] = []  # the timeouts of the ray.get/ray.wait calls that would have blocked on a call under way


class Ref:
    """An ObjectRef stand-in: what ray.get gives for it (a value, or an error raised)."""

    def __init__(self, method: str, args: tuple, outcome: Any = None) -> None:
        self.method, self.args, self.outcome = method, args, outcome
        self.ready = outcome is not PENDING


class Method:
    def __init__(self, handle: Handle, name: str) -> None:
        self.handle, self.name = handle, name

    def remote(self, *args: Any) -> Ref:
        ref = Ref(self.name, args, self.handle.outcomes[self.name].popleft() if self.handle.outcomes[self.name] else None)
        self.handle.calls.append(ref)
        return ref


class Handle:
    """An actor handle stand-in: each method's call gives the next of its outcomes."""

    def __init__(self, **outcomes: list[Any]) -> None:
        self.outcomes = {name: deque(values) for name, values in outcomes.items()}
        self.calls: list[Ref] = []

    def __getattr__(self, name: str) -> Method:
        if name.startswith("_"):
            raise AttributeError(name)
        self.outcomes.setdefault(name, deque())
        return Method(self, name)


def fake_get(ref: Ref, timeout: float | None = None) -> Any:
    from ray.exceptions import GetTimeoutError

    if not ref.ready:
        BLOCKED.append(timeout if timeout is not None else float("inf"))
        raise GetTimeoutError("under way")
    if isinstance(ref.outcome, BaseException):
        raise ref.outcome
    return ref.outcome


def fake_wait(refs: list[Ref], num_returns: int = 1, timeout: float | None = None, fetch_local: bool = True):
    ready = [ref for ref in refs if ref.ready][:num_returns]
    if len(ready) < num_returns and (timeout is None or timeout > 0):
        BLOCKED.append(timeout if timeout is not None else float("inf"))
    return ready, [ref for ref in refs if ref not in ready]


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    BLOCKED.clear()
    for module in (actors_module, executor_module):
        monkeypatch.setattr(module.ray, "get", fake_get)
        monkeypatch.setattr(module.ray, "wait", fake_wait)
    monkeypatch.setattr(executor_module.ray.util, "list_named_actors", lambda all_namespaces=False: [])  # no cluster
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [])  # no node names its host


def task_error(cause: Exception) -> RayTaskError:
    """What ray.get raises for a method that raised `cause` in a live actor."""
    traceback = f'Traceback (most recent call last):\n  File "actors.py", line 1, in wait\n{type(cause).__name__}: {cause}'
    return RayTaskError("wait", traceback, cause).as_instanceof_cause()


# -- the executor's watch on a run's exit --------------------------------------------------------


@pytest.fixture
def executor(tmp_path: Path, fake_ray: None) -> RayExecutor:
    settings = load_settings(state_dir=tmp_path / "state", cluster={
        "backend": "ray", "address": "127.0.0.1:1", "storage": str(tmp_path / "storage"), "namespace": "units",
    })  # fmt: skip
    ex = RayExecutor(settings, Handle(), {})
    ex._swept = True
    return ex


def test_an_actor_of_an_earlier_fleetd_is_adopted_and_waited_on_without_a_timeout(
    executor: RayExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its `where` says nothing of a bounded wait; its `wait` takes no argument (a TypeError
    # raised inside it for any), and returns the exit status at the worker's exit.
    old = Handle(where=[{"node_id": "n1", "hostname": "h", "pid": 9, "log_path": "l"}],
                 wait=[{"code": 0, "signal": None}])
    monkeypatch.setattr(executor_module.ray, "get_actor", lambda name, namespace: old)
    assert executor.matches(7, 0.0, ("ray-actor", "units", "run-000007-pong"))
    assert executor.watch(7, False)
    asked = [c for c in old.calls if c.method == "wait"]
    assert [c.args for c in asked] == [()]  # no timeout: the old interface
    exited = executor._exited(7, asked[0])
    assert exited is not None and exited.status.code == 0 and not exited.status.node_lost


def test_an_actor_of_this_fleetd_is_asked_with_a_bounded_wait(executor: RayExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    new = Handle(where=[{"node_id": "n1", "hostname": "h", "pid": 9, "log_path": "l", "bounded_wait": True}])
    monkeypatch.setattr(executor_module.ray, "get_actor", lambda name, namespace: new)
    assert executor.matches(8, 0.0, ("ray-actor", "units", "run-000008-pong"))
    assert executor.watch(8, False)
    assert [c.args for c in new.calls if c.method == "wait"] == [(executor_module.RUN_WAIT_S,)]


def test_a_runs_game_is_read_back_from_its_actors_name() -> None:
    name = executor_module.actor_name("space-invaders", 1234567)  # a dash in the game, a 7-digit run id
    assert executor_module._Run(name, None, None).game == "space-invaders"


NODES = [
    {"NodeID": "n-a", "Alive": True, "NodeManagerHostname": "box-a", "Resources": {"CPU": 8.0, "fleetd_host_a": 1.0}},
    {"NodeID": "n-b", "Alive": True, "NodeManagerHostname": "box-b", "Resources": {"CPU": 8.0}},
]  # fmt: skip


@pytest.mark.parametrize(("node", "pins", "host"), [
    ("n-a", {}, "a"),  # its node names host a: a start of the game is pinned there
    ("n-b", {}, None),  # a node named by its hostname only: Ray places the game's starts
    ("n-a", {"pong": {"node_b": 0.01}}, None),  # the operator pins the game: its pin places it
])  # fmt: skip
def test_an_adopted_run_is_located_with_the_host_its_starts_are_pinned_to_where_that_is_its_nodes(
    tmp_path: Path, fake_ray: None, monkeypatch: pytest.MonkeyPatch, node: str, pins: dict, host: str | None
) -> None:
    settings = load_settings(state_dir=tmp_path / "state", cluster={
        "backend": "ray", "address": "127.0.0.1:1", "storage": str(tmp_path / "storage"), "namespace": "units",
        "pins": pins})  # fmt: skip
    executor = RayExecutor(settings, Handle(), {})
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: NODES)
    adopted = Handle(where=[{"node_id": node, "hostname": "box", "pid": 9, "log_path": "l", "bounded_wait": True}])
    monkeypatch.setattr(executor_module.ray, "get_actor", lambda name, namespace: adopted)
    assert executor.matches(7, 0.0, ("ray-actor", "units", "run-000007-pong")) and executor.watch(7, False)
    assert executor._located == [executor_module.Located(7, node, host)]
    pinned = executor._placement("pong", 1, host="a").get("resources")
    assert pinned == (dict(pins["pong"]) if pins else {"fleetd_host_a": executor_module.HOST_SHARE})  # as starts are


def test_a_nodes_facts_read_is_never_waited_for_and_one_that_failed_there_is_logged_not_tried_again(
    executor: RayExecutor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from fleetd.store.records import HostFacts

    a_facts = HostFacts((), 64 * 2**30, 16)
    reads = {"n-a": Ref("read", (), PENDING), "n-b": Ref("read", (), task_error(OSError("psutil refused")))}
    started: list[str] = []
    monkeypatch.setattr(executor._facts, "_start", lambda node_id: started.append(node_id) or reads[node_id])
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: NODES)
    with caplog.at_level(logging.WARNING, logger="fleetd.cluster.nodes"):
        assert {n.node_id: n.facts for n in executor.nodes()} == {"n-a": None, "n-b": None}
    assert BLOCKED == []  # looked at, not waited for
    assert [r.getMessage() for r in caplog.records] == [
        "node n-b: its host's facts (GPUs, memory) could not be read there, so its games are sized by the head's: "
        "OSError: psutil refused"]
    reads["n-a"].outcome, reads["n-a"].ready = a_facts, True
    assert {n.node_id: n.facts for n in executor.nodes()} == {"n-a": a_facts, "n-b": None}
    assert {n.node_id: n.facts for n in executor.nodes()} == {"n-a": a_facts, "n-b": None}
    assert sorted(started) == ["n-a", "n-b"]  # once each in their node life
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: [{**NODES[0], "Alive": False}, NODES[1]])
    assert [n.facts for n in executor.nodes()] == [None, None]  # a dead node's read is no longer listed
    assert sorted(started) == ["n-a", "n-b"] and executor._facts._known == {"n-b": None}


class EarlierActor(Handle):
    """A run actor of a fleetd before `measure`."""

    def __getattr__(self, name: str) -> Method:
        if name == "measure":
            raise AttributeError(name)
        return super().__getattr__(name)


def test_each_watched_runs_worker_is_measured_on_its_node_by_its_handle_in_one_bounded_round(
    executor: RayExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetd.governor.footprint import Measured, Reading
    from fleetd.host.samples import HostSample, ProcessSample, Snapshot

    def answer(node_id: str) -> dict:
        worker = ProcessSample("worker", 4242, 1, 3 * 2**30, 50.0, None)
        return {"node_id": node_id, "pid": 4242,
                "snapshot": Snapshot(0.0, (), False, "no NVML", HostSample(None, None, None, None), (worker,))}

    on_a, on_b, elsewhere = answer("n-a"), answer("n-b"), answer("n-unlisted")
    waits: list[float | None] = []
    monkeypatch.setattr(executor_module.ray, "nodes", lambda: NODES)
    monkeypatch.setattr(executor_module.ray, "wait", lambda refs, num_returns, timeout, fetch_local: (
        waits.append(timeout) or fake_wait(refs, num_returns, 0)))  # fmt: skip
    executor._runs = {
        7: _Run("run-000007-pong", Handle(measure=[on_a]), None),
        6: _Run("run-000006-tennis", Handle(measure=[on_b]), None),  # a node named by its hostname (node_seen)
        8: _Run("run-000008-seaquest", Handle(measure=[PENDING]), None),  # its node hung: left out
        9: _Run("run-000009-boxing", Handle(measure=[None]), None),  # its worker exited
        10: _Run("run-000010-breakout", EarlierActor(), None),  # no `measure`: left out
        11: _Run("run-000011-skiing", Handle(measure=[task_error(OSError("gone"))]), None),
        12: _Run("run-000012-pitfall", Handle(measure=[elsewhere]), None),  # a node the GCS does not list: no host
    }
    assert executor.measure() == [Measured(Reading("pong", 7, 3 * 2**30, None), "a", on_a["snapshot"]),
                                  Measured(Reading("tennis", 6, 3 * 2**30, None), "box-b", on_b["snapshot"])]
    assert waits == [executor_module.MEASURE_TIMEOUT_S]  # one wait for all: a hung node costs it once
    executor._runs = {}
    assert executor.measure() == [] and waits == [executor_module.MEASURE_TIMEOUT_S]


def test_a_restarted_daemon_probes_every_run_actor_at_once_so_a_hung_nodes_runs_cost_one_timeout(
    executor: RayExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probes run before the daemon is ready (systemd's TimeoutStartSec=120s). A hung node's
    actors (a swap storm, a partition not declared yet) did not answer each for PROBE_TIMEOUT_S,
    one after another: three of them took 66 s on a real cluster, past the unit's start timeout
    with the connect's version check. Every run actor is asked at the first probe now: they cost
    one timeout together, and each is still killed and lost."""
    from types import SimpleNamespace

    now = [1000.0]

    def blocking_get(ref: Ref, timeout: float | None = None) -> Any:
        if not ref.ready:
            now[0] += timeout or 0.0  # waited that long, in vain
        return fake_get(ref, timeout)

    monkeypatch.setattr(executor_module.ray, "get", blocking_get)
    clock = SimpleNamespace(monotonic=lambda: now[0], time=lambda: now[0], sleep=lambda s: None)
    monkeypatch.setattr(executor_module, "time", clock)
    hung = {f"run-00000{i}-g{i}": Handle(where=[PENDING]) for i in (1, 2, 3)}
    live = Handle(where=[{"node_id": "n1", "hostname": "h", "pid": 9, "log_path": "l", "bounded_wait": True}])
    handles = {**hung, "run-000004-g4": live}
    monkeypatch.setattr(executor_module.ray.util, "list_named_actors", lambda all_namespaces=False: [
        {"namespace": "units", "name": name} for name in handles] + [{"namespace": "other", "name": "run-000009-x"}])
    def get_actor(name: str, namespace: str) -> Handle:
        if name not in handles:
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return handles[name]

    monkeypatch.setattr(executor_module.ray, "get_actor", get_actor)
    killed: list[Any] = []
    monkeypatch.setattr(executor_module.ray, "kill", lambda actor, no_restart=True: killed.append(actor))

    found = [executor.matches(i, 0.0, ("ray-actor", "units", name)) for i, name in enumerate(handles, start=1)]
    assert found == [False, False, False, True]
    assert now[0] - 1000.0 == executor_module.PROBE_TIMEOUT_S  # one timeout for all, not three
    assert killed == list(hung.values()) and 4 in executor._adoptable
    assert all(len(h.calls) == 1 for h in handles.values())  # each asked once
    assert not executor.matches(5, 0.0, ("ray-actor", "units", "run-000005-gone"))  # no such actor: not waited for


def test_an_error_raised_in_an_actors_wait_ends_that_run_as_a_logged_crash(
    executor: RayExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    failing = Handle(wait=[task_error(TypeError("RunActor.wait() takes 1 positional argument but 2 were given"))])
    executor._track(5, _Run("run-000005-pong", failing, None, node_id="n1"))
    ref = failing.calls[0]
    with caplog.at_level(logging.ERROR, logger="fleetd.cluster.executor"):
        exited = executor._collect([ref])  # what the loop does with a ready ref: no exception escapes
    assert [(e.pid, e.status.code, e.status.signal, e.status.node_lost) for e in exited] == [(5, None, None, False)]
    assert 5 in executor._ended and 5 not in executor._runs
    assert any("run-000005-pong: waiting for its exit failed" in r.getMessage() and "TypeError: RunActor.wait() takes 1" in r.getMessage()
               for r in caplog.records)


def test_a_refused_report_from_the_hub_is_a_warning_naming_its_game_and_run_once(
    executor: RayExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that sends a bad report at every interval: one warning for its game and run (it
    was one every batch, naming neither), the rest at debug; its good reports still taken."""
    from workers.protocol.reports import CheckpointReport, CheckpointSummary, ProgressReport, encode_report

    good = ProgressReport("pong", 7, 42, 1767200000.0, 128, 3, 10.5, 3.0, None, None, None)
    bad = encode_report(CheckpointReport("pong", 7, 42, 1767200000.0, CheckpointSummary("/c", 128, 3, float("inf"), 1)))
    with caplog.at_level(logging.DEBUG, logger="fleetd.cluster.executor"):
        taken = [executor._take_reports(Ref("take", (), [bad, encode_report(good)])) for _ in range(2)]
    assert [[r.report for r in batch] for batch in taken] == [[good], [good]]
    refused = [r for r in caplog.records if "ignored a malformed checkpoint report (game 'pong', run 7)" in r.getMessage()]
    assert [r.levelno for r in refused] == [logging.WARNING, logging.DEBUG]


# -- the version check at connect ------------------------------------------------------------------


def test_a_node_that_does_not_answer_the_version_check_is_logged_not_refused_as_a_skew(
    fake_ray: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A hung node (a swap storm, a partition the GCS has not declared yet) made the daemon
    refuse to start as a version skew, exit 78, which systemd does not retry: one node down
    stopped the whole fleet. It is named in the log now; a node that answers with other
    versions is still refused, and a hung node costs one deadline for all nodes, not one each."""
    from fleetd.cluster.actors import versions
    from fleetd.cluster.executor import CONNECT_CHECK_TIMEOUT_S, ClusterError, check_nodes

    here = versions()
    answers: dict[str, Any] = {"ok": here, "hung": PENDING, "hung2": PENDING}  # by hostname
    node_ids = {name: f"{index + 1:056x}" for index, name in enumerate(["ok", "hung", "hung2", "old"])}
    by_id = {node_id: name for name, node_id in node_ids.items()}

    class Probe:
        def options(self, scheduling_strategy: Any, **_: Any) -> Any:
            outcome = answers[by_id[scheduling_strategy.node_id]]
            return type("Bound", (), {"remote": lambda self: Ref("versions", (), outcome)})()

    def table() -> list[dict]:
        return [{"NodeID": node_ids[name], "NodeManagerHostname": name, "Alive": True} for name in answers]

    monkeypatch.setattr(executor_module.ray, "nodes", table)
    monkeypatch.setattr(executor_module.ray, "remote", lambda function: Probe())
    with caplog.at_level(logging.WARNING, logger="fleetd.cluster.executor"):
        check_nodes(here)
    assert BLOCKED == [CONNECT_CHECK_TIMEOUT_S]
    assert any("did not answer the version check" in r.getMessage() and "hung (000000" in r.getMessage()
               and "hung2 (000000" in r.getMessage() for r in caplog.records)
    answers["old"] = {**here, "fleetd": "0.0.1"}
    with pytest.raises(ClusterError) as caught:
        check_nodes(here)
    assert "old (000000000000): fleetd " in str(caught.value) and "hung" not in str(caught.value)


# -- the run actor's relay of reports to the hub -------------------------------------------------


def relay(hub: Handle) -> RunActor:
    """A run actor's relay side alone: no worker, no socket."""
    actor = RunActor.__new__(RunActor)
    actor._hub, actor._namespace = hub, "units"
    actor._pending = deque()
    return actor


def test_a_batch_the_hub_may_have_taken_is_not_sent_again(fake_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """ActorUnavailableError: the hub did not answer, and may have run the put. A second copy of
    a batch would be reports taken twice (a second ResumedReport resets the run's counters)."""
    hub = Handle(put=[ActorUnavailableError("connection lost", None)])
    looked_up: list[str] = []
    monkeypatch.setattr(actors_module, "report_hub", lambda namespace: looked_up.append(namespace) or Handle())
    actor = relay(hub)
    actor._deliver([b"r1", b"r2"], final=True)
    assert [c.args for c in hub.calls] == [([b"r1", b"r2"],)] and looked_up == []


def test_a_batch_whose_hub_died_goes_to_the_hub_found_again_by_name(fake_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = Handle(put=[ActorDiedError()])
    replacement = Handle()
    monkeypatch.setattr(actors_module, "report_hub", lambda namespace: replacement)
    actor = relay(hub)
    actor._deliver([b"r1"], final=True)
    assert [c.args for c in hub.calls] == [([b"r1"],)]
    assert [c.args for c in replacement.calls] == [([b"r1"],)] and actor._hub is replacement


def test_a_batch_while_the_worker_runs_is_not_waited_for_the_final_one_waits_for_all(fake_ray: None) -> None:
    """A slow hub: the relay reads on (the worker's datagrams are not left in the socket, nor its
    exit held past the actor's wait for the relay); the final batch waits for all puts."""
    hub = Handle(put=[PENDING, PENDING])
    actor = relay(hub)
    actor._deliver([b"r1"])
    actor._deliver([b"r2"])
    assert BLOCKED == [] and len(actor._pending) == 2
    for call in hub.calls:
        call.ready = True  # the hub took them
    actor._deliver([b"r3"], final=True)
    assert [c.args for c in hub.calls] == [([b"r1"],), ([b"r2"],), ([b"r3"],)] and not actor._pending


def test_batches_a_dead_hub_failed_go_to_its_replacement_in_order(fake_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = Handle(put=[ActorDiedError(), ActorDiedError()])
    replacement = Handle()
    looked_up: list[Handle] = []
    monkeypatch.setattr(actors_module, "report_hub", lambda namespace: looked_up.append(replacement) or replacement)
    actor = relay(hub)
    actor._deliver([b"r1"])
    actor._deliver([b"r2"])  # r1's failure is seen now: the hub is looked up again
    actor._deliver([b"r3"], final=True)
    assert [c.args for c in replacement.calls] == [([b"r1"],), ([b"r2"],), ([b"r3"],)]
    assert len(looked_up) == 1 and not actor._pending


def test_a_batch_sent_to_the_new_hub_does_not_overtake_one_whose_failure_is_seen_later(
    fake_ray: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r1 and r2 both went to the hub before it died; r1's failure is seen first, r2's is not yet
    when r3 goes. r2 goes again with r1, before r3: the daemon takes them in the worker's order."""
    hub = Handle(put=[ActorDiedError(), ActorDiedError()])
    replacement = Handle()
    monkeypatch.setattr(actors_module, "report_hub", lambda namespace: replacement)
    actor = relay(hub)
    actor._deliver([b"r1"])
    hub.calls[0].ready = False  # r1's put under way
    actor._deliver([b"r2"])
    hub.calls[0].ready, hub.calls[1].ready = True, False  # r1's failure is in; r2's is not yet
    actor._deliver([b"r3"])
    hub.calls[1].ready = True
    actor._deliver([b"r4"], final=True)
    assert [c.args for c in replacement.calls] == [([b"r1"],), ([b"r2"],), ([b"r3"],), ([b"r4"],)]
    assert not actor._pending


def test_an_actor_whose_handle_refuses_a_timeout_is_asked_without_one(executor: RayExecutor) -> None:
    """Ray checks a call against the method's signature where the handle was got: an earlier
    fleetd's actor that did not say so in `where` refuses the timeout at once, with a TypeError."""

    class Refusing(Handle):
        def __getattr__(self, name: str) -> Method:
            method = super().__getattr__(name)
            if name == "wait":
                plain = method.remote

                def remote(*args: Any) -> Ref:
                    if args:
                        raise TypeError("too many positional arguments")
                    return plain()

                method.remote = remote  # type: ignore[method-assign]
            return method

    old = Refusing(wait=[{"code": 3, "signal": None}])
    executor._track(6, _Run("run-000006-pong", old, None, node_id="n1"))
    assert [c.args for c in old.calls if c.method == "wait"] == [()]
    exited = executor._exited(6, executor._runs[6].wait_ref)
    assert exited is not None and exited.status.code == 3


def test_a_new_run_actor_removes_the_folders_of_killed_ones_and_no_other() -> None:
    """A killed run actor leaves its folder (socket and spec) in its node's temp dir: the next one
    removes it, but not the folder of an actor alive, nor of one not yet bound, nor anyone else's."""
    import shutil
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))  # short: a unix socket path has 108 bytes

    def run_dir(name: str, *, bound: bool | None) -> tuple[Path, socket.socket | None]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "spec.json").write_text("{}")
        if bound is None:
            return folder, None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(folder / "p.sock"))
        if not bound:
            sock.close()  # its actor killed: the socket file stays, nobody reads it
        return folder, sock

    killed, _ = run_dir(f"{actors_module.RUN_DIR_PREFIX}killed", bound=False)
    alive, held = run_dir(f"{actors_module.RUN_DIR_PREFIX}alive", bound=True)
    starting, _ = run_dir(f"{actors_module.RUN_DIR_PREFIX}starting", bound=None)
    other, _ = run_dir("someone-else", bound=False)
    try:
        assert actors_module.remove_stale_run_dirs(tmp_path) == [killed]
        assert not killed.exists()
        assert alive.exists() and starting.exists() and other.exists()
        assert actors_module.remove_stale_run_dirs(tmp_path) == []
    finally:
        assert held is not None
        held.close()
        shutil.rmtree(tmp_path)
