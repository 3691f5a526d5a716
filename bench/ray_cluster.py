"""A real Ray cluster on this one machine: a head and N worker nodes, each a `ray start --block`
in a process group of its own, on ports of its own, with custom resources naming it.

Used by tests/test_ray_cluster.py and bench/cluster.py. Killing a node's whole process group
(`kill_node`) is a power cut of that host: its raylet, its Ray workers and their children go at
once, and the head's GCS declares the node dead after its health checks fail.

Every process this starts is recorded and stopped by `stop()`: the nodes' groups are killed by
the pgids recorded at start, and the cluster's temp dir (its own, never /tmp/ray) removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# The head's GCS declares a node dead after `failure_threshold` missed checks, one every
# `period_ms` (Ray's defaults: 3000 ms and 5, so about 15-20 s; fleetd's docs/cluster.md).
FAST_HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
FIXED_PORTS = 10  # node manager, object manager, agents, metrics
# Every Ray worker process (one per actor) takes a port of its node's range: the range bounds
# the actors a node can hold.
WORKER_PORTS = 40
START_TIMEOUT_S = 120.0


@dataclass
class Node:
    name: str
    process: subprocess.Popen
    resources: dict[str, float]
    node_manager_port: int
    log_path: Path
    log_offset: int  # where this start's output begins in the log

    @property
    def pgid(self) -> int:
        return self.process.pid  # started with start_new_session: its own group


@dataclass
class LocalRayCluster:
    root: Path  # the cluster's own temp dir and node logs live under here
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)  # extra environment for every node
    worker_ports: int = WORKER_PORTS  # per node: at most this many actors on each
    nodes: dict[str, Node] = field(default_factory=dict)
    gcs_port: int = 0
    _next_port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def temp_dir(self) -> Path:
        return self.root / "ray"

    def start_head(self, num_cpus: int = 0, resources: dict[str, float] | None = None) -> Node:
        self.root.mkdir(parents=True, exist_ok=True)
        self._next_port = _free_port_block(self._per_node * 10)
        self.gcs_port = self._take(1)
        extra = ["--head", f"--port={self.gcs_port}", f"--ray-client-server-port={self._take(1)}",
                 "--include-dashboard=false", f"--temp-dir={self.temp_dir}", "--disable-usage-stats"]
        return self._start("head", extra, num_cpus, resources or {})

    def add_node(self, name: str, num_cpus: int, resources: dict[str, float] | None = None) -> Node:
        return self._start(name, [f"--address={self.address}"], num_cpus, resources or {})

    def _start(self, name: str, extra: list[str], num_cpus: int, resources: dict[str, float]) -> Node:
        """`ray start` gives a node 30 s to register with the GCS, which a loaded machine can
        miss: a node that fails to start is started again (on fresh ports), twice at most."""
        for attempt in range(3):
            node = self._launch(name, extra, num_cpus, resources)
            try:
                self._wait_joined(node)
                return node
            except RuntimeError:
                self.nodes.pop(name, None)
                _killpg(node.pgid, signal.SIGKILL)
                node.process.wait(timeout=30)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _launch(self, name: str, extra: list[str], num_cpus: int, resources: dict[str, float]) -> Node:
        import json

        ports = self._take(self._per_node)
        argv = [
            str(Path(self.python).with_name("ray")), "start", "--block", *extra,
            f"--num-cpus={num_cpus}", "--num-gpus=0", f"--resources={json.dumps(resources)}",
            "--node-ip-address=127.0.0.1",
            f"--node-manager-port={ports}", f"--object-manager-port={ports + 1}",
            f"--runtime-env-agent-port={ports + 2}", f"--dashboard-agent-grpc-port={ports + 3}",
            f"--dashboard-agent-listen-port={ports + 4}", f"--metrics-export-port={ports + 5}",
            f"--min-worker-port={ports + FIXED_PORTS}", f"--max-worker-port={ports + self._per_node - 1}",
        ]  # fmt: skip
        env = {**os.environ, **FAST_HEALTH_CHECKS, **self.env, "RAY_USAGE_STATS_ENABLED": "0"}
        log_path = self.root / f"{name}.log"
        with log_path.open("ab") as log:
            log.write(f"--- {' '.join(argv)}\n".encode())
            offset = log.tell()
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, start_new_session=True)
        node = Node(name, process, dict(resources), ports, log_path, offset)
        self.nodes[name] = node
        return node

    @property
    def _per_node(self) -> int:
        return FIXED_PORTS + self.worker_ports

    def _take(self, count: int) -> int:
        port, self._next_port = self._next_port, self._next_port + count
        return port

    def _wait_joined(self, node: Node) -> None:
        """Until `ray start` says the node runs (it has registered with the GCS by then)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with node.log_path.open("rb") as log:
                log.seek(node.log_offset)
                if b"Ray runtime started" in log.read():
                    return
            if node.process.poll() is not None:
                raise RuntimeError(f"ray node {node.name} exited ({node.process.returncode}); see {node.log_path}")
            time.sleep(0.25)
        raise RuntimeError(f"ray node {node.name} did not start within {START_TIMEOUT_S:.0f}s; see {node.log_path}")

    def alive_node_ports(self) -> set[int]:
        """The node manager ports of the nodes the GCS lists alive, asked in a subprocess (no
        ray.init in the caller)."""
        code = ("import ray,sys;ray.init(address=sys.argv[1],logging_level='ERROR',log_to_driver=False);"
                "print(' '.join(str(n['NodeManagerPort']) for n in ray.nodes() if n['Alive']))")
        out = subprocess.run([self.python, "-c", code, self.address], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
        return {int(p) for p in out.stdout.split()} if out.returncode == 0 else set()

    def kill_node(self, name: str) -> None:
        """A power cut: SIGKILL to the node's whole process group and to every process below
        its `ray start` (the raylet starts its Ray workers in sessions of their own, and they
        their training workers), all taken in one pass before any is killed."""
        node = self.nodes[name]
        for pid in self.node_pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _killpg(node.pgid, signal.SIGKILL)
        node.process.wait(timeout=30)

    def node_pids(self, name: str) -> list[int]:
        """Every process of a node: its `ray start` and everything below it."""
        import psutil

        node = self.nodes[name]
        try:
            root = psutil.Process(node.process.pid)
            return [node.process.pid, *(child.pid for child in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def restart_node(self, name: str) -> Node:
        node = self.nodes.pop(name)
        return self.add_node(name, int(_cpus_of(node)), node.resources)

    def stop(self) -> None:
        """Worker nodes first, then the head; each group killed by the pgid recorded at its start."""
        for name in [n for n in self.nodes if n != "head"] + (["head"] if "head" in self.nodes else []):
            node = self.nodes[name]
            below = self.node_pids(name)[1:]
            _killpg(node.pgid, signal.SIGTERM)
            try:
                node.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            _killpg(node.pgid, signal.SIGKILL)
            for pid in below:  # Ray workers left behind by a raylet that was slow to clean up
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                node.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        self.nodes.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _cpus_of(node: Node) -> str:
    arg = next(a for a in node.process.args if a.startswith("--num-cpus="))
    return arg.split("=", 1)[1]


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _free_port_block(size: int) -> int:
    """A block of `size` ports none of which is bound now (checked, not reserved)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        base = 20000 + (base % 30000)
        if all(_port_free(p) for p in range(base, base + size)):
            return base
    raise RuntimeError(f"no block of {size} free ports")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
