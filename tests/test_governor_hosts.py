"""One governor per host on a cluster, with the fake clock, a fake launcher and reactor over a
real SQLite store: each host climbs its own ladder, a host's reboot steps that host back alone
(by its own rungs' memory), its games run meanwhile on a host with room, and come home.

Hosts are recorded as the hosts job records them (`observe_nodes`, from what the GCS lists);
the controller reads them at its steps, as in the daemon. Deterministic: no sleeps, no Ray."""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from fleetd.api import create_app
from fleetd.api.metrics import fleet_metrics
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.cli.exit_codes import ExitCode
from fleetd.cli.main import app
from fleetd.cli.render import console, hosts_table
from fleetd.config import AlertSettings, Settings, load_settings
from fleetd.governor.controller import FleetController
from fleetd.governor.scaling import Scaled
from fleetd.operations.alerts import AlertSender
from fleetd.states import State
from fleetd.store import fleet as fleet_store
from fleetd.store import games as game_store
from fleetd.store.engine import Database
from fleetd.store.models import HostGovernor
from fleetd.store.events import EventFilter, read_events
from fleetd.store.hosts import observe_nodes
from fleetd.store.runs import read_runs
from fleetd.store.records import GameDraft, GpuFact, HostFacts, NodeSeen, RungMemory
from fleetd.errors import FleetdError
from fleetd.supervision.commands import ForgetHost, Shutdown
from fleetd.supervision.recorder import Recorder
from fleetd.supervision.supervisor import Supervisor
from fleetd.host.samples import HostSample, Snapshot
from fleetd.governor.core import Pressure
from fleetd.host.uptime import record_daemon_start
from tests.api_context import CATALOG, on_ray, serving
from tests.fakes import FakeClock, FakeHost
from tests.supervision_fakes import FakeLauncher, FakeReactor
from tests.test_cli_exit_codes import config_for, fleetd
from tests.test_operator_intent import SteppingPort
from tests.test_sizing_fleet import H100
from workers.protocol.reports import ProgressReport

MIN = 60.0
# start at 2 games per host; the first window 60 min, then 30; long proven after 3 h.
FLEET = {"tier": "auto", "start_games": 2, "first_window_s": 60 * MIN, "window_s": 30 * MIN,
         "reboot_outside_after_s": 180 * MIN}  # fmt: skip


class NoProbe:
    def matches(self, pid: int, start_time: float, cmdline: tuple[str, ...]) -> bool:
        return False


@dataclass
class WorkersLive(NoProbe):
    """The probe of a daemon started again on this boot after a kill -9: every worker it left
    lives but these."""

    dead: set[int] = field(default_factory=set)

    def matches(self, pid: int, start_time: float, cmdline: tuple[str, ...]) -> bool:
        return pid not in self.dead


@dataclass
class Cluster:
    """Two GPU hosts (and a head that runs no games), their Ray node lives, a supervisor."""

    settings: Settings
    db: Database
    clock: FakeClock
    boot_pk: int
    launcher: FakeLauncher = field(default_factory=lambda: FakeLauncher(write_specs=True))
    lives: dict[str, list[str]] = field(default_factory=lambda: {"head": ["n-head-1"], "a": ["n-a-1"], "b": ["n-b-1"]})
    down: set[str] = field(default_factory=set)
    probe: NoProbe = field(default_factory=NoProbe)
    facts: dict[str, HostFacts] = field(default_factory=dict)  # as read on each host's node (none: not yet)
    samples: dict[str, Snapshot] = field(default_factory=dict)  # each host's node sample, taken every minute
    steps_done: int = 0
    signals_seen: int = 0
    sup: Supervisor | None = None

    def start(self) -> Supervisor:
        self.observe()
        fleet = FleetController(self.settings.fleet, self.db, self.clock, telemetry=None, cluster=True)
        recorder = Recorder(self.db, self.clock, self.boot_pk)
        self.reactor = FakeReactor(self.clock)
        self.sup = Supervisor(self.settings, self.db, self.clock, self.launcher, self.reactor, recorder, self.probe, fleet)
        self.sup.recover()
        return self.sup

    @property
    def fleet(self) -> FleetController:
        assert self.sup is not None
        return self.sup.fleet

    def add(self, *names: str) -> None:
        for name in names:
            with self.db.transaction() as session:
                game_store.create_game(session, GameDraft(name, "CartPole-v1", "ppo"), self.clock.now())
            self.clock.advance(1)  # distinct creation times: admission order is by age

    def observe(self) -> None:
        """The hosts job: every life the GCS lists, the newest alive unless the host is down."""
        nodes = []
        for host, lives in self.lives.items():
            cpus = 0.0 if host == "head" else 8.0
            for node_id in lives:
                alive = node_id == lives[-1] and host not in self.down
                nodes.append(NodeSeen(node_id, host, "box", "10.0.0.1", {"CPU": cpus, f"fleetd_host_{host}": 1.0}, alive,
                                      self.facts.get(host) if alive else None))
        with self.db.transaction() as session:
            observe_nodes(session, nodes, self.clock.now())

    def kill_9_and_restart(self, located: dict[str, str] | None = None, died: tuple[str, ...] = (),
                           unpinned: tuple[str, ...] = ()) -> Supervisor:
        """The daemon killed -9 and started again: its live workers adopted (but those of `died`,
        which ended while no daemon ran), each located on the node of the host it was pinned to
        (`located`: name -> host, where another), as the Ray executor's watch locates an adopted
        actor (its first wait tells the supervisor), with the host its starts are pinned to as the
        executor answers it, but none for the games `unpinned` (the executor's `_pinned_host`: a
        node named by its hostname, a game in [cluster] pins; tests/test_ray_units.py)."""
        assert self.sup is not None
        live = {name: proc.pid for name, proc in self.sup.procs.items() if proc.state in (State.STARTING, State.RUNNING)}
        self.probe = WorkersLive({live.pop(name) for name in died})
        sup = self.start()
        for name, pid in live.items():
            host = (located or {}).get(name) or self.pinned(name)
            self.reactor.locate(pid, self.lives[host][-1], None if name in unpinned else host)
        sup.step()
        return sup

    def power_cut(self, host: str, seen: bool = True) -> None:
        """The host's node dies: its workers end `node_lost`, the GCS lists it dead (`seen`:
        the hosts job has run since)."""
        assert self.sup is not None
        self.down.add(host)
        for name in self.on(host):
            proc = self.sup.procs[name]
            if proc.pid is not None and proc.state in (State.STARTING, State.RUNNING):
                self.reactor.exit(proc.pid, node_lost=True)
        if seen:
            self.observe()

    def rejoin(self, host: str) -> None:
        """The host is back: a new node life."""
        self.down.discard(host)
        self.lives[host].append(f"n-{host}-{len(self.lives[host]) + 1}")
        self.observe()

    def run(self, minutes: float) -> None:
        """Time passes; every live worker reports progress every minute."""
        assert self.sup is not None
        for _ in range(max(1, int(minutes))):
            self.clock.advance(60)
            self.steps_done += 1
            for name, proc in self.sup.procs.items():
                if proc.pid is not None and proc.run_id is not None and proc.state in (State.STARTING, State.RUNNING):
                    at = self.clock.now().timestamp()
                    self.reactor.report(ProgressReport(name, proc.run_id, proc.pid, at, self.steps_done, 0, 100.0, 0.0, None, None, None))
            if self.samples:  # the node readings job, as its nodes' run actors answer
                self.fleet.readings.take_node_samples(self.samples)
            self.sup.step()
            self.obey_signals()
        self.sup.step()

    def steps(self) -> None:
        """One turn of the supervisor's loop, as its thread takes it: `SteppingPort` turns it so
        (the tests call `sup.step()`)."""
        assert self.sup is not None
        self.sup.step()

    def obey_signals(self) -> None:
        """Workers told to stop write their final checkpoint and exit 0."""
        for pid, _ in self.launcher.signals[self.signals_seen :]:
            if pid in self.reactor.watched:
                self.reactor.exit(pid, code=0)
        self.signals_seen = len(self.launcher.signals)

    def on(self, host: str) -> list[str]:
        return [name for name in self.fleet._on(host)]

    def rung(self, host: str) -> str:
        return self.fleet.governors[host].rung.label

    def pinned(self, name: str) -> str | None:
        """The host the newest worker of `name` was launched pinned to."""
        return [launch.host for launch in self.launcher.launches if launch.game == name][-1]

    def running_on(self, host: str) -> set[str]:
        assert self.sup is not None
        return {n for n, p in self.sup.procs.items() if p.state in (State.STARTING, State.RUNNING) and self.pinned(n) == host}


@pytest.fixture
def settings(tmp_path, boot_id_file) -> Settings:
    return load_settings(state_dir=tmp_path / "state", host={"boot_id_path": boot_id_file}, fleet=FLEET)


@pytest.fixture
def cluster(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> Cluster:
    start = record_daemon_start(db, host.current_boot(), clock.now())
    return Cluster(settings, db, clock, start.boot.id)


def climbed(cluster: Cluster) -> None:
    """Homes a: g1 g3 g5, b: g2 g4. After the first window a climbs to 3 games (3x32) and b,
    wanting no third game, to 4x48 (more envs for its two): b has room for two more, since b
    ran 4 games at 4x48 before (a rung proven with 2 games only holds 2 until more prove it)."""
    with cluster.db.transaction() as session:
        fleet_store.save_rung(session, RungMemory(4, 48, proven_at=cluster.clock.now(), proven_games=4), "b")
    cluster.add("g1", "g2", "g3", "g4", "g5")
    cluster.start()
    cluster.run(1)
    assert (cluster.on("a"), cluster.on("b")) == (["g1", "g3"], ["g2", "g4"])
    assert cluster.fleet.view(cluster.sup._slots()).pending == ("g5",)
    cluster.run(61)
    assert (cluster.rung("a"), cluster.rung("b")) == ("3x32", "4x48")
    assert cluster.on("a") == ["g1", "g3", "g5"]
    assert {n: cluster.pinned(n) for n in ("g1", "g2", "g3", "g4", "g5")} == {"g1": "a", "g2": "b", "g3": "a", "g4": "b", "g5": "a"}


def test_games_get_a_home_host_each_and_workers_are_pinned_to_the_host_that_admitted_them(cluster: Cluster) -> None:
    climbed(cluster)
    assert "head" not in cluster.fleet.governors  # it offers no CPUs: it runs no games
    view = cluster.sup.snapshot.governor
    assert [(h.name, h.rung, h.allowed, h.games) for h in view.hosts] == [
        ("a", "3x32", 3, ("g1", "g3", "g5")), ("b", "4x48", 4, ("g2", "g4"))
    ]
    assert view.allowed == 7 and view.rung == "a 3x32, b 4x48"
    # Each worker is sized for its own host's rung and the games sharing that host.
    (a_tier, a_games), (b_tier, b_games) = cluster.fleet.sizing("g1"), cluster.fleet.sizing("g2")
    assert (a_tier.num_envs, a_games, b_tier.num_envs, b_games) == (32, 3, 48, 2)


def test_a_reboot_at_an_unproven_rung_steps_that_host_back_alone_and_its_surplus_runs_on_the_other(cluster: Cluster) -> None:
    climbed(cluster)
    b_memory = dict(cluster.fleet.governors["b"].memory)
    cluster.run(10)  # a is at 3x32 for 10 min: not proven there

    cluster.power_cut("a")
    cluster.run(1)
    # While a is down, its games run on b as guests as far as b's rung has room (4 games).
    assert cluster.on("a") == [] and len(cluster.on("b")) == 4
    assert cluster.running_on("b") >= {"g2", "g4"}
    cluster.rejoin("a")
    cluster.run(1)

    assert cluster.rung("a") == "2x32 (light)"  # back to its highest proven rung
    assert cluster.rung("b") == "4x48" and cluster.fleet.governors["b"].memory == b_memory
    # a holds two of its own again; its third runs on b, which has room under b's rung.
    assert len(cluster.on("a")) == 2 and set(cluster.on("a")) < {"g1", "g3", "g5"}
    (guest,) = {"g1", "g3", "g5"} - set(cluster.on("a"))
    assert set(cluster.on("b")) == {"g2", "g4", guest}
    cluster.run(2)
    assert cluster.running_on("b") == {"g2", "g4", guest} and cluster.running_on("a") == set(cluster.on("a"))
    events = _events(cluster, "fleet_backoff")
    assert len(events) == 1 and events[0].message.startswith("host a: back-off after reboot (at 3x32, not proven)")
    assert events[0].details == {"host": "a"}


def test_a_reboot_at_a_rung_proven_for_long_is_an_outside_event_and_every_game_comes_back_home(cluster: Cluster) -> None:
    climbed(cluster)
    cluster.run(7 * 60)  # both at the top of the ladder, proven there for long
    a_rung, b_rung = cluster.rung("a"), cluster.rung("b")
    assert a_rung == b_rung == "8x256 (heavy)"
    assert cluster.on("a") == ["g1", "g3", "g5"]

    cluster.power_cut("a")
    cluster.run(1)
    assert cluster.on("a") == []
    cluster.rejoin("a")
    cluster.run(2)

    assert (cluster.rung("a"), cluster.rung("b")) == (a_rung, b_rung)
    assert sorted(cluster.on("a")) == ["g1", "g3", "g5"] and cluster.on("b") == ["g2", "g4"]
    assert cluster.running_on("a") == {"g1", "g3", "g5"} and cluster.running_on("b") == {"g2", "g4"}
    assert [e.message.split(":")[0] for e in _events(cluster, "fleet_reboot_outside")] == ["host a"]
    assert _events(cluster, "fleet_backoff") == []


def test_a_run_lost_with_its_node_moves_the_hosts_games_before_the_hosts_job_sees_it_dead(cluster: Cluster) -> None:
    climbed(cluster)
    cluster.power_cut("a", seen=False)
    cluster.run(1)
    assert cluster.on("a") == [] and len(cluster.on("b")) == 4
    assert all(cluster.pinned(n) == "b" for n in cluster.on("b"))
    assert not {h.name: h.alive for h in cluster.sup.snapshot.governor.hosts}["a"]


def test_workers_on_a_host_that_went_down_are_not_stopped_but_end_node_lost_as_ray_reports_each(cluster: Cluster) -> None:
    # Ray reports each actor's death on its own, seconds apart: the first run lost marks the
    # host down and its games are placed elsewhere, but the workers still listed on that host
    # are not sent a stop (recorded `stopped`): each ends with its own cause, `node_lost`.
    climbed(cluster)
    *rest, first = cluster.on("a")  # g5, spawned after the host's life joined, is lost first
    cluster.down.add("a")
    signals_before = len(cluster.launcher.signals)
    cluster.reactor.exit(cluster.sup.procs[first].pid, node_lost=True)
    for _ in range(3):
        cluster.clock.advance(2)
        cluster.sup.step()
    stopped = {pid for pid, _ in cluster.launcher.signals[signals_before:]}
    assert not stopped & {cluster.sup.procs[name].pid for name in rest}
    for name in rest:
        cluster.reactor.exit(cluster.sup.procs[name].pid, node_lost=True)
    cluster.run(1)
    with cluster.db.transaction() as session:
        causes = {name: [r.cause for r in read_runs(session, game_store.read_game(session, name).id, name, 5)]
                  for name in (first, *rest)}
    assert all(runs[-1] == "node_lost" for runs in causes.values()), causes  # newest first: the runs on a
    cluster.run(2)
    moved = {n for n in (first, *rest) if cluster.sup.procs[n].state in (State.STARTING, State.RUNNING)}
    assert moved and moved <= cluster.running_on("b") and not cluster.running_on("a")  # as guests on b


def test_workers_adopted_on_a_host_that_went_down_are_not_stopped_but_end_node_lost(cluster: Cluster) -> None:
    # An adopted worker's host was not known: once its host was down and its game placed
    # elsewhere or pending, it was sent a stop, and its run ended `stopped`, not `node_lost`.
    climbed(cluster)
    sup = cluster.kill_9_and_restart()
    assert sup.snapshot is not None and all(sup.procs[n].state is State.RUNNING for n in ("g1", "g2", "g3", "g4", "g5"))
    *rest, first = cluster.on("a")
    adopted = {name: sup.procs[name].run_id for name in (first, *rest)}
    cluster.down.add("a")
    signals_before = len(cluster.launcher.signals)
    cluster.reactor.exit(sup.procs[first].pid, node_lost=True)
    for _ in range(3):
        cluster.clock.advance(2)
        sup.step()
    assert not {pid for pid, _ in cluster.launcher.signals[signals_before:]} & {sup.procs[n].pid for n in rest}
    for name in rest:
        cluster.reactor.exit(sup.procs[name].pid, node_lost=True)
    cluster.run(1)
    with cluster.db.transaction() as session:
        causes = {name: [r.cause for r in read_runs(session, game_store.read_game(session, name).id, name, 5)
                         if r.id == run_id] for name, run_id in adopted.items()}
    assert causes == dict.fromkeys(adopted, ["node_lost"])


def test_a_worker_adopted_on_another_host_than_its_slots_moves_to_its_slot(cluster: Cluster) -> None:
    # The daemon moved g1's slot to host a (stored) and was killed before it stopped g1's worker,
    # which runs on b: adopted, it was left there, on a host that holds no slot for it.
    climbed(cluster)
    sup = cluster.kill_9_and_restart(located={"g1": "b"})
    assert sup._placing.hosts == {"g1": "b", "g2": "b", "g3": "a", "g4": "b", "g5": "a"}
    adopted = sup.procs["g1"].pid
    cluster.run(1)
    assert (adopted, "SIGTERM") in cluster.launcher.signals
    assert sup.procs["g1"].state in (State.STARTING, State.RUNNING) and cluster.pinned("g1") == "a"
    with cluster.db.transaction() as session:
        runs = read_runs(session, game_store.read_game(session, "g1").id, "g1", 5)
    assert [(run.pid, run.cause) for run in runs[:2]] == [(sup.procs["g1"].pid, None), (adopted, "stopped")]  # newest first


def test_a_worker_adopted_where_a_restart_would_not_be_pinned_is_left_where_it_runs(cluster: Cluster) -> None:
    # The executor locates it with no pinned host (a node named by its hostname, a game in
    # [cluster] pins): Ray places its starts where it likes. Taken as on its host, a worker found
    # on another host than its slot's would be moved at every daemon restart, to land anywhere again.
    climbed(cluster)
    sup = cluster.kill_9_and_restart(located={"g1": "b"}, unpinned=("g1",))
    adopted = sup.procs["g1"].pid
    cluster.run(1)
    assert "g1" not in sup._placing.hosts and sup.procs["g1"].pid == adopted
    assert sup.procs["g1"].state is State.RUNNING and (adopted, "SIGTERM") not in cluster.launcher.signals


def test_a_hand_over_through_a_daemon_kill_holds_back_the_starts_on_the_givers_host_alone(cluster: Cluster) -> None:
    # The operator asked for light (2 games a host); the daemon stored the step back (g5 evicted
    # on a) and was killed before it stopped g5, and g2's and g3's workers ended while no daemon
    # ran: g5, adopted without a slot, stops, and g3 waits for it (a's slots hold g1 and g5).
    # Every start on the cluster waited for it, g2's on b too, though b's slots held one live
    # worker (g4's) of 2.
    climbed(cluster)
    g5 = cluster.sup.procs["g5"].pid
    with cluster.db.transaction() as session:
        fleet_store.update_fleet_requested(session, "light", cluster.clock.now())
    cluster.fleet.govern(cluster.sup._slots())
    sup = cluster.kill_9_and_restart(died=("g2", "g3"))
    assert sup.procs["g5"].state is State.STOPPING and {n: cluster.fleet.host_of(n) for n in sup.procs} == {
        "g1": "a", "g2": "b", "g3": "a", "g4": "b", "g5": None}
    sup.step()
    assert sup.procs["g2"].state is State.STARTING and cluster.pinned("g2") == "b"
    assert sup.procs["g3"].state is State.STOPPED and sup.snapshot.held["g3"] == "waiting for g5 to stop (hand-over)"
    cluster.reactor.exit(g5, code=0)
    sup.step()
    assert sup.procs["g3"].state is State.STARTING and cluster.pinned("g3") == "a"


def test_crashes_of_running_games_count_against_the_host_they_ran_on(cluster: Cluster) -> None:
    climbed(cluster)
    for name in ("g1", "g3"):  # two running games on a crash within the crash window
        cluster.reactor.exit(cluster.sup.procs[name].pid, code=1)
        cluster.run(1)
    assert cluster.rung("a") == "2x32 (light)" and cluster.rung("b") == "4x48"


def test_a_host_that_joins_starts_capped_by_the_stored_request_not_the_configs_tier(cluster: Cluster, settings: Settings) -> None:
    """The stored request is auto; the config now says light (not applied: the database's tier
    rules). A host joining starts at start_games (4x32), as auto does, not at light's 2x32."""
    cluster.add("g1", "g2", "g3", "g4", "g5")
    cluster.start()
    cluster.run(1)
    cluster.lives["c"] = ["n-c-1"]
    cluster.observe()
    edited = settings.fleet.model_copy(update={"tier": "light", "start_games": 4})
    restarted = FleetController(edited, cluster.db, cluster.clock, telemetry=None, cluster=True)
    restarted.govern(cluster.sup._slots())
    joined = restarted.governors["c"]
    assert joined.state.requested == "auto" and joined.rung.label == "4x32"


def test_each_hosts_rung_and_memory_survive_a_controller_reload(cluster: Cluster, settings: Settings) -> None:
    climbed(cluster)
    cluster.run(10)
    cluster.power_cut("a")
    cluster.rejoin("a")
    cluster.run(1)
    before = {h: (g.rung.label, g.memory, g.state.stable_since) for h, g in cluster.fleet.governors.items()}
    placed = {n: cluster.fleet.host_of(n) for n in ("g1", "g2", "g3", "g4", "g5")}
    backoffs = {h: g.last_backoff for h, g in cluster.fleet.governors.items()}
    assert backoffs["a"] is not None and backoffs["b"] is None  # the reboot's, a's alone

    reloaded = FleetController(settings.fleet, cluster.db, cluster.clock, telemetry=None, cluster=True)
    assert {h: (g.rung.label, g.memory, g.state.stable_since) for h, g in reloaded.governors.items()} == before
    assert {h: g.last_backoff for h, g in reloaded.governors.items()} == backoffs  # `fleetd hosts` still shows it
    assert {n: reloaded.host_of(n) for n in placed} == placed
    # The life a's governor accounted for is stored: the reload is no second reboot.
    reloaded.govern(cluster.sup._slots())
    assert reloaded.governors["a"].rung.label == before["a"][0] and len(_events(cluster, "fleet_backoff")) == 1
    with cluster.db.transaction() as session:
        assert set(fleet_store.read_rungs(session, "a")) >= {(2, 32), (3, 32)}
        assert fleet_store.read_rungs(session, "") == {} or (3, 32) not in fleet_store.read_rungs(session, "")


def test_each_hosts_rung_in_the_hosts_api_and_fleetd_hosts(cluster: Cluster) -> None:
    climbed(cluster)
    cluster.run(10)
    cluster.power_cut("a")
    cluster.rejoin("a")
    cluster.run(1)
    info = DaemonInfo(cluster.boot_pk, cluster.clock.now())
    context = AppContext(on_ray(cluster.settings), cluster.db, cluster.clock, "t" * 32, info, CATALOG, cluster.sup)
    client = TestClient(create_app(context))
    client.headers["Authorization"] = "Bearer " + "t" * 32
    document = client.get("/api/v1/hosts").json()
    hosts = {h["name"]: h for h in document["items"]}
    assert hosts["head"]["governor"] is None  # no CPUs: no games, no governor
    a, b = hosts["a"]["governor"], hosts["b"]["governor"]
    assert (a["rung"], a["allowed"], len(a["games"]), a["guests"]) == ("2x32 (light)", 2, 2, [])
    assert (b["rung"], b["allowed"], len(b["games"]), len(b["guests"])) == ("4x48", 4, 3, 1)
    assert a["last_backoff"] is not None and "reboot" in a["last_backoff"] and b["last_backoff"] is None
    assert any(line.startswith("3x32") and "failed 1x" in line for line in a["rungs"])
    assert hosts["a"]["boots"] == 2
    with console.capture() as captured:
        console.print(hosts_table(document))
    table = captured.get()  # a tier's rung named once; one between two tiers with the tier it is under
    assert "2x32 (light) " in table and "(light) (light)" not in table and "4x48 (light)" in table, table
    assert "3/4, 1 guests" in table


def _events(cluster: Cluster, kind: str) -> list:
    with cluster.db.transaction() as session:
        return read_events(session, EventFilter(kind=kind, limit=100))


def test_each_hosts_back_off_is_alerted_though_another_host_backed_off_within_the_window(cluster: Cluster) -> None:
    """The de-duplication window is per host: b's back-off minutes after a's is not held back
    as `one like it`, which would leave b's never said (its count waits for b's next one)."""
    texts: list[str] = []

    def receive(request: httpx.Request) -> httpx.Response:
        texts.append(json.loads(request.content)["text"])
        return httpx.Response(200)

    sender = AlertSender(AlertSettings(webhook_url="http://hook.test/x", webhook_format="slack", dedup_window_s=600),
                         host="head", transport=httpx.MockTransport(receive))
    climbed(cluster)
    cluster.fleet.alerts = sender
    cluster.run(10)
    for host in ("a", "b"):
        cluster.power_cut(host)
        cluster.run(1)
        cluster.rejoin(host)
        cluster.run(1)
    sender.start()
    sender.stop(timeout=5.0)
    assert [e.details["host"] for e in _events(cluster, "fleet_backoff")] == ["b", "a"]
    assert sender.held_back == 0 and len(texts) == 2
    assert "stepped host a down" in texts[0] and "stepped host b down" in texts[1]


def test_a_node_that_held_no_game_reboots_without_a_back_off(cluster: Cluster) -> None:
    # Its games moved to the other node by its new life, a node's reboot is judged by its rung;
    # but one that held none when it went down (fewer games than nodes, every game stopped) went
    # down without the fleet's load on it, as the daemon's own host does: nothing moves.
    cluster.add("g1")
    cluster.start()
    cluster.run(10)
    idle = "b" if not cluster.on("b") else "a"
    cluster.power_cut(idle)
    cluster.run(1)
    cluster.rejoin(idle)
    cluster.run(1)
    assert not [e for e in _events(cluster, "fleet_backoff") if e.message.startswith(f"host {idle}")]
    assert [e for e in _events(cluster, "fleet_reboot_outside") if e.message.startswith(f"host {idle}")]


def test_a_node_that_crashed_under_load_backs_off_though_the_hosts_job_saw_it_dead_late(cluster: Cluster) -> None:
    # Its runs lost, its games were moved off before the hosts job listed it dead: counted then,
    # it held none, and its reboot under load moved nothing.
    climbed(cluster)
    cluster.run(10)  # a at 3x32 for 10 min: unproven
    cluster.power_cut("a", seen=False)
    cluster.run(1)
    cluster.observe()
    cluster.rejoin("a")
    cluster.run(1)
    assert [e for e in _events(cluster, "fleet_backoff") if e.message.startswith("host a")]


def stepped_context(cluster: Cluster) -> AppContext:
    """The API's context on the cluster's store, its commands carried out by the supervisor's next turn."""
    info = DaemonInfo(cluster.boot_pk, cluster.clock.now())
    return AppContext(on_ray(cluster.settings), cluster.db, cluster.clock, "t" * 32, info, CATALOG, SteppingPort(cluster))


def stepped_client(cluster: Cluster) -> TestClient:
    """The API (`stepped_context`) as a client with the token."""
    client = TestClient(create_app(stepped_context(cluster)))
    client.headers["Authorization"] = "Bearer " + "t" * 32
    return client


def test_a_host_gone_for_good_is_forgotten_by_the_supervisor_once_it_is_down_and_holds_no_game(cluster: Cluster) -> None:
    # A node removed from the cluster stayed forever: `fleetd hosts` listed it, /metrics kept its
    # `fleetd_cluster_host_up 0` series and its governor lived on in the supervisor's thread.
    climbed(cluster)
    cluster.reactor.locate(cluster.sup.procs["g1"].pid, "n-a-1")  # the executor says where its run is
    cluster.run(10)
    client = stepped_client(cluster)
    up = client.delete("/api/v1/hosts/a")
    assert up.status_code == 409 and "host 'a' is up" in up.json()["error"]["message"], up.text
    cluster.down.add("a")  # the hosts job lists it dead before Ray reports its runs lost
    cluster.observe()
    held = client.delete("/api/v1/hosts/a")
    assert held.status_code == 409, held.text
    assert held.json()["error"]["details"] == {"host": "a", "reason": "games", "games": ["g1", "g3", "g5"]}
    assert "a" in cluster.fleet.governors
    for name in ("g3", "g5"):  # Ray reports these runs lost; g1's is still open on a's node
        cluster.reactor.exit(cluster.sup.procs[name].pid, node_lost=True)
    cluster.run(1)  # a's games go to b as guests (or pending); a stays their home
    assert cluster.on("a") == [] and {cluster.fleet._placed[n].home for n in ("g1", "g3", "g5")} == {"a"}
    running = client.delete("/api/v1/hosts/a")
    assert running.status_code == 409 and running.json()["error"]["details"]["games"] == ["g1"], running.text
    cluster.reactor.exit(cluster.sup.procs["g1"].pid, node_lost=True)
    cluster.run(1)

    assert client.delete("/api/v1/hosts/a").status_code == 204
    fleet = cluster.fleet
    assert all("a" not in kept for kept in (fleet.governors, fleet._nodes, fleet._lives, fleet._lost, fleet._held_on))
    assert [h["name"] for h in client.get("/api/v1/hosts").json()["items"]] == ["b", "head"]
    assert 'host="a"' not in client.get("/metrics").text
    assert [h.name for h in cluster.sup.snapshot.governor.hosts] == ["b"]
    with cluster.db.transaction() as session:
        assert session.get(HostGovernor, "a") is None and fleet_store.read_rungs(session, "a") == {}
        placed = fleet_store.read_placements(session)
    # Its games running on b as guests are at home there; one pending waits for a home as a new game does.
    assert (placed["g3"].home, placed["g5"].home, "g1" in placed) == ("b", "b", False)
    assert cluster.on("b") == ["g2", "g4", "g3", "g5"] and cluster.sup.snapshot.governor.hosts[0].guests == ()
    (event,) = _events(cluster, "host_forgotten")
    # Where each game it was home to is homed now: the host it runs on, or none yet while pending.
    assert event.details == {"host": "a", "lives": 1, "homes": {"g1": None, "g3": "b", "g5": "b"}}
    assert event.message.endswith("homed where they run: g1 once admitted, g3 on b, g5 on b"), event.message
    reloaded = FleetController(cluster.settings.fleet, cluster.db, cluster.clock, telemetry=None, cluster=True)
    assert sorted(reloaded.governors) == ["b"]
    assert client.delete("/api/v1/hosts/a").status_code == 404

    cluster.rejoin("a")  # a node under its name again is a new host: its governor starts afresh
    cluster.run(1)
    assert cluster.rung("a") == "2x32 (light)" and cluster.fleet.governors["a"].memory == {}


def test_fleetd_hosts_forget_answers_as_the_daemon_does_and_fleetd_hosts_still_lists(cluster: Cluster, tmp_path) -> None:
    cluster.start()
    cluster.down.add("a")
    cluster.observe()
    with serving(stepped_context(cluster)) as url:
        config = config_for(tmp_path, int(url.rsplit(":", 1)[1]), token="t" * 32)
        refused = fleetd(config, "hosts", "forget", "b")
        assert refused.exit_code == ExitCode.ERROR and "host 'b' is up" in refused.output, refused.output
        assert fleetd(config, "hosts", "forget", "nosuch").exit_code == ExitCode.NOT_FOUND
        done = fleetd(config, "hosts", "forget", "a")
        assert done.exit_code == 0 and done.output.startswith("host a forgotten"), done.output
        listed = fleetd(config, "hosts", "--json")
    assert listed.exit_code == 0 and [h["name"] for h in json.loads(listed.output)["items"]] == ["b", "head"]


def test_a_down_host_whose_workers_ray_has_not_reported_lost_is_not_forgotten(cluster: Cluster) -> None:
    # Once the governor saw a down, its games were placed on b and their runs never located had
    # no node: the forget went through, `host_down("a")` knew a no more, and the next turn
    # signalled the dead actors, their runs ending `stopped` instead of `node_lost`.
    climbed(cluster)
    cluster.down.add("a")
    cluster.observe()
    cluster.run(1)
    assert cluster.on("a") == []  # re-placed, their workers still on a's node
    signals = len(cluster.launcher.signals)
    held = stepped_client(cluster).delete("/api/v1/hosts/a")
    assert held.status_code == 409, held.text
    assert held.json()["error"]["details"] == {"host": "a", "reason": "games", "games": ["g1", "g3", "g5"]}
    cluster.sup.step()
    assert len(cluster.launcher.signals) == signals and "a" in cluster.fleet.governors


def test_fleetd_hosts_forget_takes_the_groups_config_and_refuses_the_groups_json(cluster: Cluster, tmp_path) -> None:
    # `fleetd hosts --config X forget a` read only forget's own --config: it asked the default
    # daemon, not X's; `fleetd hosts --json forget a` forgot without a word about --json.
    cluster.start()
    cluster.down.add("a")
    cluster.observe()
    with serving(stepped_context(cluster)) as url:
        config = str(config_for(tmp_path, int(url.rsplit(":", 1)[1]), token="t" * 32))
        runner = CliRunner()
        as_json = runner.invoke(app, ["hosts", "--config", config, "--json", "forget", "a"], env={"COLUMNS": "200"})
        assert as_json.exit_code == ExitCode.USAGE and "--json is for the hosts listing" in as_json.output, as_json.output
        assert [h["name"] for h in client_hosts(stepped_client(cluster))] == ["a", "b", "head"]
        done = runner.invoke(app, ["hosts", "--config", config, "forget", "a"], env={"COLUMNS": "200"})
        assert done.exit_code == 0 and done.output.startswith("host a forgotten"), done.output
    assert [h["name"] for h in client_hosts(stepped_client(cluster))] == ["b", "head"]


def client_hosts(client: TestClient) -> list[dict]:
    return client.get("/api/v1/hosts").json()["items"]


def test_a_forget_met_by_a_shutdown_is_refused_naming_the_host(cluster: Cluster) -> None:
    cluster.start()
    forget = ForgetHost("a", Future())
    cluster.sup.submit(forget)
    cluster.sup.submit(Shutdown(leave_workers=True))
    cluster.sup.step()
    refused = forget.reply.exception(timeout=0)
    assert isinstance(refused, FleetdError) and refused.details == {"host": "a"}, refused
    assert str(refused.message).startswith("cannot forget host 'a': fleetd is stopping"), refused.message


H100_HEAD = Snapshot(0.0, (H100,), True, None, HostSample(256 * 2**30, 200 * 2**30, 10.0, 1.0), ())


def sized_on_an_h100_head(cluster: Cluster) -> tuple[Scaled, Scaled]:
    """`climbed`, then a step with the head's telemetry reading an H100: g1's sizing (on a), g2's (on b)."""
    climbed(cluster)
    cluster.fleet.telemetry = SimpleNamespace(latest=H100_HEAD)
    cluster.sup.step()
    (a, _), (b, _) = cluster.fleet.sizing("g1"), cluster.fleet.sizing("g2")
    assert a.sizing is not None and b.sizing is not None
    return a, b


def test_each_hosts_sizing_counts_the_games_wanting_a_slot_on_that_host(cluster: Cluster) -> None:
    """a holds g1 g3 g5 at 3x32, b g2 g4 at 4x48: b's GPU and memory are checked for its 2
    games, not the fleet's 5 (nor its rung's 4); a's for its 3."""
    a, b = sized_on_an_h100_head(cluster)
    assert (a.sizing.games, a.sizing.rung_games, b.sizing.games, b.sizing.rung_games) == (3, 3, 2, 4)
    # Each host's mark is stored with its rung: a restarted daemon sizes its kept workers the same.
    restarted = FleetController(cluster.settings.fleet, cluster.db, cluster.clock, SimpleNamespace(latest=H100_HEAD), cluster=True)
    (a, _), (b, _) = restarted.sizing("g1"), restarted.sizing("g2")
    assert a.sizing is not None and b.sizing is not None and (a.sizing.games, b.sizing.games) == (3, 2)


L4 = GpuFact("NVIDIA L4", 23_034 * 2**20)


def test_each_hosts_games_are_sized_by_the_gpus_read_on_its_node_not_the_heads(cluster: Cluster) -> None:
    """a's node read one 24 GB GPU there, b's has not answered yet: a's games are sized by its
    own GPU and memory (and by it from a restarted daemon's first look, before any step), b's by
    the head's H100 as before; once b's read finds no GPU there, as CPU workers. The head sized
    every host by its own GPU."""
    cluster.facts["a"] = HostFacts((L4,), 64 * 2**30, 16)
    a, b = sized_on_an_h100_head(cluster)
    assert a.sizing.gpu == "NVIDIA L4" and a.sizing.gpu_room_bytes == pytest.approx(0.9 * L4.memory_total_bytes, abs=1)
    assert a.sizing.host_room_bytes < 64 * 2**30 and b.sizing.gpu == H100.name
    restarted = FleetController(cluster.settings.fleet, cluster.db, cluster.clock, SimpleNamespace(latest=H100_HEAD), cluster=True)
    (again, _) = restarted.sizing("g1")
    assert again.sizing is not None and again.sizing.gpu == "NVIDIA L4"
    # A head without a GPU: a's games still sized by a's GPU; b's by the rung's own values.
    headless = FleetController(cluster.settings.fleet, cluster.db, cluster.clock, None, cluster=True, gpus_on_nodes=True)
    (a, _), (b, _) = headless.sizing("g1"), headless.sizing("g2")
    assert a.sizing is not None and a.sizing.gpu == "NVIDIA L4"
    assert b.sizing is None and "the games' GPUs are their Ray nodes'" in b.reason
    cluster.facts["b"] = HostFacts((), 32 * 2**30, 8)  # b's read: no GPU there
    cluster.observe()
    cluster.run(1)
    (b, _) = cluster.fleet.sizing("g2")
    assert b.sizing is None and not b.on_gpu and "no GPU seen" in b.reason, b.reason


def test_a_hosts_pressure_read_on_its_node_backs_that_host_off_alone_and_a_stale_sample_holds_nothing(
        cluster: Cluster) -> None:
    """a's node reads 5% of its memory available (its run actors' samples): a admits nothing more
    and, after the grace period, steps down; b, with no pressure, keeps its rung. Once a's node
    stops answering, its last sample says nothing of pressure: with games there it is stale (no
    climb), with none nothing."""
    climbed(cluster)
    full = Snapshot(0.0, (), False, "no NVML", HostSample(64 * 2**30, round(0.05 * 64 * 2**30), 10.0, 1.0), ())
    cluster.samples = {"a": full}
    cluster.run(3)  # past the 60 s grace period
    assert cluster.rung("a") == "2x32 (light)" and cluster.rung("b") == "4x48"
    backoff = cluster.fleet.governors["a"].last_backoff
    assert backoff is not None and "host memory available 5% < 10%" in backoff, backoff
    assert cluster.fleet.governors["b"].last_backoff is None
    view = cluster.sup.snapshot.governor  # as GET /api/v1/hosts and /fleet (fleetd tier) show it
    assert {h.name: h.pressure for h in view.hosts} == {"a": ("host memory available 5% < 10%",), "b": ()}
    assert view.pressure == ("host a: host memory available 5% < 10%",)
    metrics = {(s.name, tuple(s.labels.values())): s.value for family in fleet_metrics(view) for s in family.samples}
    assert metrics[("fleetd_cluster_host_pressure_reasons", ("a",))] == 1.0
    assert metrics[("fleetd_cluster_host_pressure_reasons", ("b",))] == 0.0
    assert metrics[("fleetd_fleet_pressure_reasons", ())] == 1.0
    cluster.samples = {}
    cluster.clock.advance(31)  # past 3 telemetry intervals since the last sample
    there = [slot for slot in cluster.sup._slots() if cluster.fleet.host_of(slot.name) == "a"]
    stale = cluster.fleet.readings.host_pressure("a", there)
    assert stale.reasons == () and stale.stale is not None and "host a's newest sample is" in stale.stale
    assert cluster.fleet.readings.host_pressure("a", []) == Pressure()  # no game there: no reading is needed
