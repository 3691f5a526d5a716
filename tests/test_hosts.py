"""Cluster hosts from the GCS's node table: lives (a new node id each time a host's Ray node
joins), downtime between them, a host's death as an event; `GET /api/v1/hosts`, the per-host
series on /metrics and `fleetd hosts`'s table. A real store, nodes as the executor hands them."""

from __future__ import annotations

from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.cli.render import console, hosts_table
from fleetd.config import Settings
from fleetd.jobs import hosts_job
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, read_events
from fleetd.store.records import NodeSeen
from tests.api_context import api_context
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

    client = TestClient(create_app(api_context(settings, db, clock, host, TOKEN)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    document = client.get("/api/v1/hosts").json()
    hosts = {h["name"]: h for h in document["items"]}
    assert sorted(hosts) == ["a", "b", "head"] and document["backend"] == "local"
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
    client = TestClient(create_app(api_context(settings, db, clock, host, TOKEN)))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    (a,) = client.get("/api/v1/hosts").json()["items"]
    assert not a["alive"] and a["boots"] == 1
    assert 'fleetd_cluster_host_up{host="a"} 0.0' in client.get("/metrics").text
