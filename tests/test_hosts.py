"""Cluster hosts from the GCS's node table: lives (a new node id each time a host's Ray node
joins), downtime between them, a host's death as an event; `GET /api/v1/hosts`, the per-host
series on /metrics and `fleetd hosts`'s table. A real store, nodes as the executor hands them.
On one host (the local backend) the same answer holds this host, its lives its kernel boots."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import replace
from datetime import datetime
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.cli.render import console, gpus_text, hosts_table
from fleetd.config import Settings
from fleetd.errors import FleetdError
from fleetd.host.samples import GpuSample, HostSample, Snapshot
from fleetd.host.uptime import heartbeat, record_daemon_start
from fleetd.jobs import hosts_job
from fleetd.states import State
from fleetd.store.engine import Database
from fleetd.store import hosts as store_hosts
from fleetd.store.events import EventFilter, read_events
from fleetd.store.hosts import delete_host
from fleetd.store.games import create_game, game_id_of, update_game_state
from fleetd.store.records import GameDraft, GpuFact, HostFacts, NodeSeen
from fleetd.store.runs import create_run
from tests.api_context import api_context, on_ray
from tests.fakes import FakeClock, FakeHost

TOKEN = "t" * 32


def node(node_id: str, host: str, alive: bool = True) -> NodeSeen:
    if not alive:  # the GCS lists a dead node without its resources: named by its hostname then
        return NodeSeen(node_id, "vm", "vm", "10.0.0.7", {}, alive)
    return NodeSeen(node_id, host, "vm", "10.0.0.7", {"CPU": 2.0, f"fleetd_host_{host}": 1.0}, alive)


def test_a_host_that_dies_and_rejoins_has_two_lives_and_its_downtime(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    nodes = [node("n-head", "head"), node("n-a1", "a"), node("n-b1", "b")]
    assert hosts_job(db, clock, lambda: nodes) == []
    clock.advance(30)
    assert hosts_job(db, clock, lambda: nodes) == []
    clock.advance(5)
    nodes = [node("n-head", "head"), node("n-a1", "a", alive=False), node("n-b1", "b")]
    assert hosts_job(db, clock, lambda: nodes) == ["a"]
    assert hosts_job(db, clock, lambda: nodes) == []  # seen dead once, recorded once
    clock.advance(120)
    nodes = [*nodes, node("n-a2", "a")]  # the GCS keeps listing the dead node id
    hosts_job(db, clock, lambda: nodes)

    client = TestClient(create_app(api_context(on_ray(settings), db, clock, host, TOKEN)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    document = client.get("/api/v1/hosts").json()
    hosts = {h["name"]: h for h in document["items"]}
    assert sorted(hosts) == ["a", "b", "head"] and document["backend"] == "ray"
    a = hosts["a"]
    assert a["alive"] and a["boots"] == 2 and [life["node_id"] for life in a["lives"]] == ["n-a1", "n-a2"]
    # Last seen alive at +30 s, back at +155 s: 125 s down.
    assert a["downtime_s"] == 125.0 and a["lives"][1]["downtime_before_s"] == 125.0
    assert a["lives"][0]["ended_at"] is not None and a["lives"][1]["ended_at"] is None
    assert hosts["b"]["boots"] == 1 and hosts["b"]["downtime_s"] == 0.0
    with db.transaction() as session:
        lost = read_events(session, EventFilter(kind="host_lost"))
    assert [e.details["host"] for e in lost] == ["a"]

    metrics = client.get("/metrics").text
    assert 'fleetd_cluster_host_up{host="a"} 1.0' in metrics
    assert 'fleetd_cluster_host_joins_total{host="a"} 2.0' in metrics
    assert 'fleetd_cluster_host_downtime_seconds_total{host="a"} 125.0' in metrics

    with console.capture() as captured:
        console.print(hosts_table(document))
    assert "125s" in captured.get() and "fleetd_host_a=1" in captured.get()


def test_a_host_whose_only_node_died_is_down(settings: Settings, db: Database, clock: FakeClock, host: FakeHost) -> None:
    hosts_job(db, clock, lambda: [node("n-a1", "a")])
    clock.advance(10)
    hosts_job(db, clock, lambda: [node("n-a1", "a", alive=False)])
    client = TestClient(create_app(api_context(on_ray(settings), db, clock, host, TOKEN)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    (a,) = client.get("/api/v1/hosts").json()["items"]
    assert not a["alive"] and a["boots"] == 1
    assert 'fleetd_cluster_host_up{host="a"} 0.0' in client.get("/metrics").text


def test_a_restarted_head_forgets_every_node_and_a_host_that_does_not_come_back_is_down(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    # A Ray head that restarts starts a GCS with an empty node table: the nodes of before are
    # listed neither alive nor dead. Their lives stayed open, so host a, which never came back,
    # was alive forever (its governor kept admitting games on it) and b's downtime was lost.
    from fleetd.store.hosts import read_host_lives

    hosts_job(db, clock, lambda: [node("n-head1", "head"), node("n-a1", "a"), node("n-b1", "b")])
    clock.advance(60)
    assert sorted(hosts_job(db, clock, lambda: [node("n-head2", "head"), node("n-b2", "b")])) == ["a", "b", "head"]
    assert hosts_job(db, clock, lambda: [node("n-head2", "head"), node("n-b2", "b")]) == []  # recorded once
    client = TestClient(create_app(api_context(on_ray(settings), db, clock, host, TOKEN)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    hosts = {h["name"]: h for h in client.get("/api/v1/hosts").json()["items"]}
    assert not hosts["a"]["alive"] and hosts["a"]["lives"][0]["ended_at"] is not None
    b = hosts["b"]
    assert b["alive"] and [life["ended_at"] is None for life in b["lives"]] == [False, True]
    assert b["downtime_s"] == 60.0
    with db.transaction() as session:
        assert {life.name: life.alive for life in read_host_lives(session)} == {"a": False, "b": True, "head": True}
        assert sorted(e.details["host"] for e in read_events(session, EventFilter(kind="host_lost"))) == ["a", "b", "head"]
    assert hosts_job(db, clock, lambda: []) == []  # an empty listing is no GCS's answer: nothing ends


def test_a_node_left_out_of_one_listing_and_listed_alive_again_is_alive_again(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    # A listing that leaves out a live node ends its life (the head restarted). When the same
    # node id was listed alive again, only its last sight moved: its host stayed down for good
    # in `fleetd hosts` and on /metrics, and its governor admitted nothing there again.
    from fleetd.store.hosts import read_host_lives

    full = [node("n-head", "head"), node("n-a1", "a"), node("n-b1", "b")]
    hosts_job(db, clock, lambda: full)
    clock.advance(30)
    assert hosts_job(db, clock, lambda: [node("n-head", "head"), node("n-b1", "b")]) == ["a"]
    clock.advance(30)
    assert hosts_job(db, clock, lambda: full) == []
    with db.transaction() as session:
        lives = {life.name: (life.alive, life.node_id) for life in read_host_lives(session)}
    assert lives["a"] == (True, "n-a1")
    client = TestClient(create_app(api_context(on_ray(settings), db, clock, host, TOKEN)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    a = {h["name"]: h for h in client.get("/api/v1/hosts").json()["items"]}["a"]
    assert a["alive"] and a["boots"] == 1 and a["lives"][0]["ended_at"] is None and a["downtime_s"] == 0.0
    assert 'fleetd_cluster_host_up{host="a"} 1.0' in client.get("/metrics").text
    clock.advance(30)  # gone again: lost again, then dead for good once the GCS says so
    assert hosts_job(db, clock, lambda: [node("n-head", "head"), node("n-b1", "b")]) == ["a"]
    clock.advance(30)
    assert hosts_job(db, clock, lambda: [*full[::2], node("n-a1", "a", alive=False)]) == []
    with db.transaction() as session:
        assert {life.name: life.alive for life in read_host_lives(session)}["a"] is False
        assert [e.details["host"] for e in read_events(session, EventFilter(kind="host_lost"))] == ["a", "a"]


def test_the_hosts_job_and_the_governor_read_the_lives_they_need_not_every_life(db: Database, clock: FakeClock) -> None:
    # A host gets a life at each join of its Ray node, and none is ever deleted. The hosts job
    # (every heartbeat, in a write transaction) loaded every life ever recorded, and the governor
    # (every 5 s, on the supervision loop) read them all for each host's newest: 0.23 s and 0.03 s
    # at 8 hosts x 1,000 lives, growing with each reboot. They read the lives they act on now.
    from sqlalchemy import event

    from fleetd.store.hosts import read_host_lives

    for life in range(30):
        hosts_job(db, clock, lambda: [node("n-b", "b"), node(f"n-a{life}", "a")])
        clock.advance(10)
        hosts_job(db, clock, lambda: [node("n-b", "b"), node(f"n-a{life}", "a", alive=False)])
        clock.advance(10)
    statements: list[str] = []
    listen = lambda *args: statements.append(args[2])  # noqa: E731  (conn, cursor, statement, ...)
    event.listen(db.engine, "before_cursor_execute", listen)
    try:
        listed = [node("n-b", "b"), node("n-a29", "a", alive=False), node("n-a30", "a")]
        assert hosts_job(db, clock, lambda: listed) == []  # n-a29 was seen dead already
        with db.transaction() as session:
            lives = {life.name: life for life in read_host_lives(session)}
    finally:
        event.remove(db.engine, "before_cursor_execute", listen)
    read_lives = [s for s in statements if s.startswith("SELECT") and "FROM host_boots" in s]
    assert read_lives and all("WHERE" in s for s in read_lives), read_lives
    assert (lives["a"].node_id, lives["a"].alive, lives["b"].node_id, lives["b"].alive) == ("n-a30", True, "n-b", True)
    clock.advance(10)
    assert hosts_job(db, clock, lambda: [node("n-b", "b"), node("n-a30", "a", alive=False)]) == ["a"]
    with db.transaction() as session:
        lives = {life.name: life for life in read_host_lives(session)}
    assert (lives["a"].node_id, lives["a"].alive) == ("n-a30", False)


def test_the_hosts_answer_lists_each_hosts_newest_lives_and_counts_them_all(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    # The status page polls GET /hosts every 10 s, and each host listed every life it ever had:
    # 1.8 MB and 0.25 s at 8 hosts x 1,000 lives, growing with each reboot. The newest 100 now
    # (`?lives=N` for more or fewer); `boots` and `downtime_s` still count every life.
    for life in range(120):
        hosts_job(db, clock, lambda: [node(f"n-a{life}", "a")])
        clock.advance(10)
        hosts_job(db, clock, lambda: [node(f"n-a{life}", "a", alive=False)])
        clock.advance(5)  # down 15 s: last seen 10 s before it was seen dead, back 5 s later
    hosts_job(db, clock, lambda: [node("n-a120", "a")])
    client = TestClient(create_app(api_context(on_ray(settings), db, clock, host, TOKEN)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    (a,) = client.get("/api/v1/hosts").json()["items"]
    assert a["boots"] == 121 and a["downtime_s"] == 120 * 15.0 and a["alive"]
    assert [life["node_id"] for life in a["lives"]] == [f"n-a{i}" for i in range(21, 121)]
    assert a["lives"][0]["downtime_before_s"] == 15.0 and a["lives"][-1]["ended_at"] is None
    (a,) = client.get("/api/v1/hosts?lives=2").json()["items"]
    assert [life["node_id"] for life in a["lives"]] == ["n-a119", "n-a120"] and a["boots"] == 121
    (a,) = client.get("/api/v1/hosts?lives=0").json()["items"]
    assert a["lives"] == [] and a["uptime_s"] is not None
    assert client.get("/api/v1/hosts?lives=-1").status_code == 422


def test_on_one_host_the_hosts_are_this_host_its_lives_its_kernel_boots(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """[cluster] backend = "local": one row, derived from the boot log, with the games whose open
    run began in this boot; an unclean reboot ends the first life (45 s down)."""
    first = record_daemon_start(db, host.current_boot(), clock.now())
    add_game_running(db, "old", first.boot.id, clock.now())  # its worker died with the boot: not live
    clock.advance(60)
    heartbeat(db, first.boot.id, clock.now())
    host.reboot(down_s=30)  # no clean stop: the power went
    clock.advance(15)  # the kernel boots; fleetd starts
    context = api_context(settings, db, clock, host, TOKEN)
    for name in ("pole", "cart"):
        add_game_running(db, name, context.daemon.boot_pk, clock.now())
    gpu = GpuSample(0, "H100", 0.0, 0, 80 * 2**30, None, None)
    telemetry = SimpleNamespace(latest=Snapshot(0.0, (gpu, gpu), True, None, HostSample(64 * 2**30, 2**30, 0.0, 0.0), ()))
    clock.advance(100)

    client = TestClient(create_app(replace(context, telemetry=telemetry)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    document = client.get("/api/v1/hosts").json()
    assert document["backend"] == "local"
    (this,) = document["items"]
    assert (this["name"], this["hostname"], this["address"]) == (socket.gethostname(), socket.gethostname(), "127.0.0.1")
    assert this["resources"] == {"CPU": float(os.cpu_count() or 1), "memory": 64.0 * 2**30, "GPU": 2.0}
    assert this["alive"] and this["boots"] == 2 and this["games"] == ["cart", "pole"]
    lives = this["lives"]
    assert [life["node_id"] for life in lives] == ["boot-0", "boot-1"]
    assert [life["clean"] for life in lives] == [False, None]  # the reboot was unclean; the second life goes on
    assert lives[0]["ended_at"] == lives[1]["joined_at"] and lives[1]["ended_at"] is None
    # Last heartbeat at +60 s, fleetd back at +105 s: the boot log's 45 s; up since the kernel booted at +90 s.
    assert lives[1]["downtime_before_s"] == 45.0 and this["downtime_s"] == 45.0 and this["uptime_s"] == 115.0
    fleet = context.snapshot.governor
    assert this["governor"]["rung"] == fleet.rung and this["governor"]["tier"] == fleet.tier
    assert this["governor"]["guests"] == [] and this["governor"]["allowed"] == fleet.allowed

    with console.capture() as captured:
        console.print(hosts_table(document))
    assert socket.gethostname() in captured.get() and "45s" in captured.get()


def test_on_one_host_forgetting_a_host_is_refused_naming_the_backend(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    client = TestClient(create_app(api_context(settings, db, clock, host, TOKEN)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    refused = client.delete(f"/api/v1/hosts/{socket.gethostname()}")
    assert refused.status_code == 409 and "backend = 'local'" in refused.json()["error"]["message"], refused.text
    assert client.delete("/api/v1/hosts/x", headers={"Authorization": "Bearer " + "w" * 32}).status_code == 401
    on_cluster = TestClient(create_app(replace(api_context(on_ray(settings), db, clock, host, TOKEN), supervisor=None)))
    on_cluster.headers["Authorization"] = f"Bearer {TOKEN}"
    alone = on_cluster.delete("/api/v1/hosts/gpu3")  # an API with no supervisor in its process
    assert alone.status_code == 409 and alone.json()["error"]["message"].startswith("cannot forget host 'gpu3'"), alone.text


def add_game_running(db: Database, name: str, boot_pk: int, now: datetime) -> None:
    """A game with an open run begun in boot `boot_pk` (fleetd's number for the boot)."""
    with db.transaction() as session:
        create_game(session, GameDraft(name, "CartPole-v1", "ppo"), now)
        update_game_state(session, name, State.RUNNING, "up", now)
        create_run(session, game_id_of(session, name), boot_pk, now)


def test_a_host_forgotten_while_the_hosts_job_reads_it_rejoining_is_no_stale_row(
    db: Database, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hosts job read its Host rows before taking the write lock: a forget that committed in
    # between left it updating a deleted row, and it failed with StaleDataError.
    hosts_job(db, clock, lambda: [node("n-head", "head"), node("n-a1", "a")])
    hosts_job(db, clock, lambda: [node("n-head", "head"), node("n-a1", "a", alive=False)])
    answers: list[object] = []
    threads: list[threading.Thread] = []
    beginning = threading.Event()  # the forget is about to begin its transaction

    def forget() -> None:
        try:
            beginning.set()
            with db.transaction(immediate=True) as session:
                answers.append(delete_host(session, "a"))
        except FleetdError as exc:
            answers.append(exc)

    def lives_then_forget(session, node_ids):  # type: ignore[no-untyped-def]
        forgetting = threading.Thread(target=forget)
        threads.append(forgetting)
        forgetting.start()
        assert beginning.wait(timeout=10.0)
        forgetting.join(timeout=0.2)  # it would be done by now without the job's write lock
        assert forgetting.is_alive() and not answers  # the hosts job holds the lock: the forget waits
        return lives_to_observe(session, node_ids)

    lives_to_observe = store_hosts._lives_to_observe
    monkeypatch.setattr(store_hosts, "_lives_to_observe", lives_then_forget)
    clock.advance(60)
    hosts_job(db, clock, lambda: [node("n-head", "head"), node("n-a1", "a", alive=False), node("n-a2", "a")])
    threads[0].join(timeout=10.0)
    (answer,) = answers  # the forget waited for the job, and then found a up again
    assert isinstance(answer, FleetdError) and answer.details["reason"] == "up", answer


def test_what_a_nodes_host_has_is_kept_from_its_read_until_a_new_read_and_listed(
    settings: Settings, db: Database, clock: FakeClock, host: FakeHost
) -> None:
    """The executor lists a node without its facts until the read on it answers, and without
    them once its life ended: the host keeps the last ones read (its games' sizing, after a
    daemon restart too), and a new life's read replaces them."""
    h100 = HostFacts((GpuFact("NVIDIA H100 80GB HBM3", 81_559 * 2**20),) * 2, 512 * 2**30, 64)
    hosts_job(db, clock, lambda: [node("n-a1", "a")])
    with db.transaction() as session:
        assert [life.facts for life in store_hosts.read_host_lives(session)] == [None]
    hosts_job(db, clock, lambda: [replace(node("n-a1", "a"), facts=h100)])
    hosts_job(db, clock, lambda: [node("n-a1", "a", alive=False)])
    with db.transaction() as session:
        assert [life.facts for life in store_hosts.read_host_lives(session)] == [h100]
    smaller = HostFacts((GpuFact("NVIDIA L4", 23_034 * 2**20),), 64 * 2**30, 16)
    hosts_job(db, clock, lambda: [node("n-a1", "a", alive=False), replace(node("n-a2", "a"), facts=smaller)])
    with db.transaction() as session:
        assert [record.facts for record in store_hosts.read_hosts(session)] == [smaller]

    client = TestClient(create_app(api_context(on_ray(settings), db, clock, host, TOKEN)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    document = client.get("/api/v1/hosts").json()
    assert document["items"][0]["facts"] == {"gpus": [{"name": "NVIDIA L4", "memory_total_bytes": 23_034 * 2**20}],
                                             "memory_bytes": 64 * 2**30, "cores": 16}
    with console.capture() as captured:
        console.print(hosts_table(document))
    [row] = [[cell.strip() for cell in line.split("│")] for line in captured.get().splitlines() if line.startswith("│")]
    assert "1x NVIDIA L4 22.49 GiB" in row
    assert gpus_text(h100.as_json()) == "2x NVIDIA H100 80GB HBM3 79.65 GiB"
    assert (gpus_text(None), gpus_text({**h100.as_json(), "gpus": []})) == ("-", "none")  # not read; read, none
