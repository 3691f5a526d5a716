"""What the cluster's GCS lists of its nodes, each named for its host, and what is read on each
node's host once a node life (its GPUs and memory: fleetd.host.facts)."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import RayError

from fleetd.cluster.actors import creation_error
from fleetd.host.facts import read_host_facts
from fleetd.store.hosts import HOST_RESOURCE
from fleetd.store.records import HostFacts, NodeSeen

log = logging.getLogger(__name__)


def node_seen(node: dict[str, Any]) -> NodeSeen:
    """A host's name: the `fleetd_host_<name>` custom resource its node offers (several Ray nodes
    on one machine, as in tests), else its hostname."""
    resources = {k: float(v) for k, v in (node.get("Resources") or {}).items()}
    named = [key[len(HOST_RESOURCE):] for key in resources if key.startswith(HOST_RESOURCE)]
    hostname = node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or "?"
    return NodeSeen(node["NodeID"], named[0] if named else hostname, hostname, node.get("NodeManagerAddress") or "",
                    resources, bool(node.get("Alive")))


def on_node(function: Any, node_id: str) -> Any:
    """A remote function's call pinned to one node, asking no CPU: it runs there even while the
    node's CPUs are all held by games (a version check, a facts read)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return function.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))


class FactsReads:
    """Each live node's host facts (fleetd.host.facts), read there once a node life by a task
    pinned to it that takes no CPU (a node full of games still answers). Never waited for: a read
    not answered yet is looked at again at the next listing, and the node is listed without its
    facts meanwhile. One that failed there is logged and not tried again in that life."""

    def __init__(self) -> None:
        self._read = ray.remote(read_host_facts)
        self._lock = threading.Lock()  # the hosts job and the supervisor's thread both list nodes
        self._pending: dict[str, Any] = {}  # node id -> the read's ObjectRef
        self._known: dict[str, HostFacts | None] = {}  # node id -> its facts (None: the read failed)

    def attach(self, seen: list[NodeSeen]) -> list[NodeSeen]:
        with self._lock:
            alive = {node.node_id for node in seen if node.alive}
            self._pending = {node_id: ref for node_id, ref in self._pending.items() if node_id in alive}
            self._known = {node_id: facts for node_id, facts in self._known.items() if node_id in alive}
            for node_id in alive - self._known.keys() - self._pending.keys():
                self._pending[node_id] = self._start(node_id)
            self._collect()
            return [replace(node, facts=self._known.get(node.node_id)) for node in seen]

    def _start(self, node_id: str) -> Any:
        return on_node(self._read, node_id).remote()

    def _collect(self) -> None:
        if not self._pending:
            return
        ready, _ = ray.wait(list(self._pending.values()), num_returns=len(self._pending), timeout=0, fetch_local=True)
        for node_id, ref in [(n, r) for n, r in self._pending.items() if r in ready]:
            del self._pending[node_id]
            try:
                self._known[node_id] = ray.get(ref)
            except RayError as exc:
                log.warning("node %s: its host's facts (GPUs, memory) could not be read there, so its games are "
                            "sized by the head's: %s", node_id[:12], creation_error(exc))
                self._known[node_id] = None
