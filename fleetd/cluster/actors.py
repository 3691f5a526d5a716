"""What runs on the cluster's nodes: one `RunActor` per run, and the head's `ReportHub`.

A run's actor starts the same worker entry as the local executor (`python -m workers --spec
FILE`) as a subprocess in a session of its own, with its output appended to the run's log in
shared storage. With a URL storage (fleetd/cluster/storage.py) the game dir is in a node-local
cache instead: the newest verified checkpoint is pulled before the worker starts, new ones are
pushed while it runs and once more after it exits, and the log stays on the node. The worker sends its typed reports (workers/protocol/reports.py) as datagrams
to a unix socket the actor binds on its own node; the actor relays them, still encoded, to the
hub, which the daemon drains (not waiting for each batch while the worker runs; at its exit,
for all of them, before the exit is known); a hub that died is looked up by name again (the daemon starts a
new one, as does an actor that finds none). The actor outlives the daemon (detached, named from
the game and the run id), so a restarted daemon finds and adopts it; once its worker has exited
it keeps the exit status until the daemon has read it and ends the actor.

A `wait` returns within 30 s (None while the worker runs; the daemon asks again), and `where`,
`signal` and `measure` (the node's telemetry sample with its worker's memory: the footprints,
and the pressure its host's governor judges) have a concurrency group of their own: a probe or a stop is answered at once, however many waits are under way.

The worker is started from a thread that lives until it exits, with PR_SET_PDEATHSIG: an actor
that dies (killed, or its node's power cut) takes its worker with it.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError

log = logging.getLogger(__name__)

HUB_NAME = "reports"
RELAY_BATCH_S = 0.2  # reports are relayed in batches at most this often (as the local reactor reads them)
HUB_MAX_HELD = 200_000  # reports kept while no daemon drains; the oldest are dropped beyond
HUB_PUT_TIMEOUT_S = 10.0  # the final batch's wait for the run's puts to land, resends included
PENDING_PUTS_MAX = 1000  # puts in flight the relay keeps an eye on
WAIT_MAX_S = 30.0  # a `wait` call returns within this even if the worker runs on: a daemon asks again
CONTROL = "control"  # the concurrency group of `where`, `signal` and `measure`: never behind blocked waits
CONTROL_THREADS = 2
RUN_DIR_PREFIX = "fleetd-run-"  # each run actor's folder in its node's temp dir
_PR_SET_PDEATHSIG = 1


def versions() -> dict[str, str]:
    """What must match between the daemon and a node: a skew is refused, not half-worked."""
    import fleetd
    from workers.protocol import PROTOCOL_VERSION

    return {"ray": ray.__version__, "fleetd": fleetd.__version__, "protocol": str(PROTOCOL_VERSION)}


def skew(expected: dict[str, str], here: dict[str, str]) -> str | None:
    """None when the versions match; else what differs, in words."""
    differs = [f"{key} {here.get(key)} (the daemon has {value})" for key, value in expected.items() if here.get(key) != value]
    return ", ".join(differs) or None


def creation_error(exc: Exception) -> str:
    """What an actor's constructor raised, as its last line says it ("RuntimeError: version skew
    on node ..."), without Ray's wrapping and traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else str(exc)


class ReportHub:
    """Holds relayed reports until the daemon takes them; takes wait for the first to arrive."""

    def __init__(self) -> None:
        self._held: deque[bytes] = deque(maxlen=HUB_MAX_HELD)
        self._arrived = asyncio.Event()

    async def put(self, batch: list[bytes]) -> None:
        self._held.extend(batch)
        self._arrived.set()

    async def take(self, timeout_s: float) -> list[bytes]:
        if not self._held:
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
            except TimeoutError:
                pass
        self._arrived.clear()
        batch = list(self._held)
        self._held.clear()
        return batch

    async def ping(self) -> bool:
        return True


def report_hub(namespace: str) -> Any:
    """The head's report hub by name: the live one, else a new one, pinned to the head node. The
    daemon and every run actor call this when the hub they had failed: all find the same one."""
    return ray.remote(ReportHub).options(
        name=HUB_NAME, namespace=namespace, lifetime="detached", get_if_exists=True,
        num_cpus=0, resources={"node:__internal_head__": 0.001},
    ).remote()  # fmt: skip


class RunActor:
    def __init__(self, spec_json: str, log_path: str, argv: list[str], cpu_threads: int,
                 expected: dict[str, str], hub: Any, storage: dict[str, str | None] | None = None,
                 namespace: str | None = None) -> None:
        here = versions()
        differs = skew(expected, here)
        context = ray.get_runtime_context()
        self.node_id = context.get_node_id()
        if differs:
            raise RuntimeError(f"version skew on node {self.node_id} ({socket.gethostname()}): {differs}; "
                               "install the daemon's versions there (docs/cluster.md)")
        self._hub = hub
        self._namespace = namespace or context.namespace  # the hub's, to find it again by name
        remove_stale_run_dirs(Path(tempfile.gettempdir()))
        self._dir = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX))  # node-local, short: a unix socket path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self._dir / "p.sock"))
        self._sock.settimeout(RELAY_BATCH_S)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024 * 1024)
        spec = json.loads(spec_json)
        spec["progress_socket"] = str(self._dir / "p.sock")
        self._sync = None
        if storage is not None:  # [cluster] storage is a URL: the game dir is in this node's cache
            from fleetd.cluster.storage import RunSync

            cache = storage.get("cache_dir")
            self._sync = RunSync(str(storage["url"]), spec["game"], Path(cache) if cache else None, spec.get("run_id"))
            log_path = str(self._sync.localize(spec, Path(log_path).name))
        spec_path = self._dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        # An empty interpreter: the node's own, the one this actor runs on.
        self._argv = [argv[0] or sys.executable, *argv[1:], "--spec", str(spec_path)]
        self._log_path = log_path
        self._cpu_threads = cpu_threads
        self._gpu_ids = ray.get_gpu_ids()  # this actor's share (num_gpus_per_game), as Ray made them visible
        self._child: subprocess.Popen | None = None
        self._sampler: Any = None  # fleetd.host.telemetry.TelemetrySampler, made at the first `measure`
        self._measure_lock = threading.Lock()
        self._status: dict[str, Any] | None = None
        self._started = threading.Event()
        self._done = threading.Event()
        self._relaying = True
        self._relayed = threading.Event()
        self._pending: deque[tuple[Any, list[bytes], Any, bool]] = deque()  # puts sent: (ref, batch, hub, resent)
        threading.Thread(target=self._relay, name="relay", daemon=True).start()
        threading.Thread(target=self._run_worker, name="worker", daemon=True).start()
        self._started.wait(60)

    # -- what the daemon calls ---------------------------------------------------------------

    @ray.method(concurrency_group=CONTROL)
    def where(self) -> dict[str, Any]:
        """The node this run is on, and its worker's pid there."""
        return {"node_id": self.node_id, "hostname": socket.gethostname(),
                "pid": None if self._child is None else self._child.pid, "log_path": self._log_path,
                "bounded_wait": True}  # `wait` takes a timeout (an actor of an earlier fleetd says nothing)

    @ray.method(concurrency_group=CONTROL)
    def measure(self) -> dict[str, Any] | None:
        """This node's telemetry sample (fleetd.host.samples.Snapshot: its GPUs, memory and
        pressure, and its worker's process tree: RSS, and GPU memory where NVML tells it per
        process), with the node's id and its worker's pid. None once the worker has
        exited, or before it started. The daemon's footprints of a cluster's workers and the
        pressure its hosts' governors go by (docs/governor.md) come from these."""
        child = self._child
        if child is None or self._done.is_set():
            return None
        with self._measure_lock:
            if self._sampler is None:
                from fleetd.host.telemetry import TelemetrySampler

                self._sampler = TelemetrySampler()
            snapshot = self._sampler.sample({"worker": child.pid})
        return {"node_id": self.node_id, "pid": child.pid, "snapshot": snapshot}

    @ray.method(concurrency_group=CONTROL)
    def signal(self, sig: int) -> bool:
        """Signal the worker's whole process group; False when it has exited already."""
        child = self._child
        if child is None or self._done.is_set():
            return False
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def wait(self, timeout_s: float = WAIT_MAX_S) -> dict[str, Any] | None:
        """The exit status once the worker has exited and its last reports are with the hub;
        None after `timeout_s` (at most WAIT_MAX_S) while it runs on. Bounded, so a call left by a
        daemon that died ends by itself and gives its thread back (a run outlives any number of
        daemon restarts)."""
        if not self._done.wait(max(0.0, min(timeout_s, WAIT_MAX_S))):
            return None
        assert self._status is not None
        return self._status

    # -- threads ---------------------------------------------------------------------------

    def _run_worker(self) -> None:
        """Starts the worker and waits for it, from this one thread: the parent-death signal
        fires when the thread that forked exits, so this thread outlives the worker."""
        try:
            if self._sync is not None:
                self._sync.pull()
            with open(self._log_path, "ab") as log, open(os.devnull, "rb") as devnull:
                self._child = subprocess.Popen(
                    self._argv, stdin=devnull, stdout=log, stderr=subprocess.STDOUT,
                    env=_worker_env(self._cpu_threads, self._gpu_ids), start_new_session=True, preexec_fn=_die_with_parent,
                )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - an unreachable storage URL too: the run ends, with why
            # The URL's checkpoints all damaged (storage.CheckpointsUnusable): exit 21, as the worker's refusal.
            error = f"could not start the worker: {exc}"
            try:
                with open(self._log_path, "a") as log:
                    log.write(f"fleetd: {error}\n")
            except OSError:
                pass
            self._finish({"code": getattr(exc, "exit_code", None), "signal": None, "error": error})
            return
        finally:
            self._started.set()
        stop_pushing, pusher = threading.Event(), None
        if self._sync is not None:
            pusher = threading.Thread(target=self._sync.push_until, args=(stop_pushing,), name="push", daemon=True)
            pusher.start()
        returncode = self._child.wait()
        stop_pushing.set()
        if pusher is not None:
            pusher.join()  # a push under way ends before the last one starts: never two uploads of one checkpoint
        try:
            os.killpg(self._child.pid, signal.SIGKILL)  # stragglers of its group go with it
        except ProcessLookupError:
            pass
        status: dict[str, Any] = {"code": returncode, "signal": None} if returncode >= 0 else {"code": None, "signal": -returncode}
        if self._sync is not None:
            try:
                self._sync.push()  # its last checkpoints are at the URL before its exit is known
            except Exception as exc:  # noqa: BLE001 - the exit still counts; the daemon logs why
                status["error"] = f"its last checkpoints did not reach {self._sync.target.url}: {exc}"
        self._finish(status)

    def _finish(self, status: dict[str, Any]) -> None:
        time.sleep(RELAY_BATCH_S)  # the worker's last datagrams are in the socket: let the relay take them
        self._relaying = False
        self._relayed.wait(HUB_PUT_TIMEOUT_S + 5.0)  # the relay's final batch waits HUB_PUT_TIMEOUT_S at most
        self._status = status
        self._done.set()

    def _relay(self) -> None:
        batch: list[bytes] = []
        flushed = time.monotonic()
        while True:
            try:
                batch.append(self._sock.recv(65536))
            except (TimeoutError, BlockingIOError):
                if not self._relaying:
                    break
            except OSError:
                break
            if batch and time.monotonic() - flushed >= RELAY_BATCH_S:
                self._deliver(batch)
                batch, flushed = [], time.monotonic()
        self._deliver(batch, final=True)  # this one and all before it delivered before the exit is
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)  # a killed actor leaves it: remove_stale_run_dirs
        self._relayed.set()

    def _deliver(self, batch: list[bytes], final: bool = False) -> None:
        """Puts a batch to the hub. A batch while the worker runs is not waited for (the relay
        reads on: a slow hub never holds up the worker's datagrams); how the earlier ones went is
        looked at as each next one goes, and the final batch waits for all of them, up to
        HUB_PUT_TIMEOUT_S, so that they are with the hub before the exit is known."""
        self._settle(None)
        if batch:
            self._pending.append((self._hub.put.remote(batch), batch, self._hub, False))
            if len(self._pending) > PENDING_PUTS_MAX:
                self._pending.popleft()  # a hub this slow: the oldest is left to arrive or not, unwatched
        if final:
            self._settle(time.monotonic() + HUB_PUT_TIMEOUT_S)

    def _settle(self, deadline: float | None) -> None:
        """Looks at the puts sent, in order: those done leave; until `deadline` (None: not at all)
        it waits for the rest. A put that failed because the hub died (ActorDiedError) is sent
        again, once, with every later one put to that hub (`_resend`); one whose hub only did not
        answer (ActorUnavailableError: it may have taken it) is not, as a report taken twice is
        not the same report (a second ResumedReport resets counters)."""
        while self._pending:
            ref, sent, hub, resent = self._pending[0]
            left = 0.0 if deadline is None else deadline - time.monotonic()
            if deadline is not None and left <= 0:
                return  # slow, or gone with the head: what has not arrived is lost
            ready, _ = ray.wait([ref], num_returns=1, timeout=left, fetch_local=False)
            if not ready:
                return  # under way: looked at again with the next batch
            self._pending.popleft()
            try:
                ray.get(ref)
            except ActorDiedError:
                if not resent:  # a resend that failed too is lost
                    self._resend(hub, sent)
            except ActorUnavailableError as exc:
                log.warning("the report hub did not answer (%s): %d reports may be lost", exc, len(sent))
            except Exception:  # noqa: BLE001 - gone with the head: this batch is lost
                continue


    def _resend(self, dead: Any, first: list[bytes]) -> None:
        """The hub `dead` died under the put of `first`: that batch and every later one put to
        it go again, at once and in the order they were sent, to the hub looked up by name again
        (the daemon's replacement, or a new one). All at once, so that no batch sent to the new
        hub since overtakes one whose failure is not seen yet: the reports reach the daemon in
        the worker's order (a resumed or checkpoint report after a later one would be taken as
        the newer)."""
        again = [first] + [batch for _, batch, hub, resent in self._pending if hub is dead and not resent]
        self._pending = deque(p for p in self._pending if p[2] is not dead)
        try:
            self._hub = report_hub(self._namespace)
        except Exception:  # noqa: BLE001 - the head is unreachable: these batches are lost
            log.warning("the report hub died and could not be found again: %d reports lost",
                        sum(len(batch) for batch in again))
            return
        for batch in again:
            self._pending.append((self._hub.put.remote(batch), batch, self._hub, True))


def remove_stale_run_dirs(temp: Path) -> list[Path]:
    """A run actor removes its folder (the worker's report socket and spec) as its relay ends; one
    killed (`ray kill`, its raylet gone) leaves it, on a node that may run for months. Each new run
    actor removes those no actor holds any more: a datagram socket whose owner is gone refuses a
    connect. A folder without its socket yet (an actor between `mkdtemp` and `bind`) or not ours
    to read is left. Answers the folders removed."""
    removed = []
    for folder in temp.glob(f"{RUN_DIR_PREFIX}*"):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(str(folder / "p.sock"))
        except ConnectionRefusedError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except OSError:  # no socket there (yet), another user's folder, a path too long
            pass
        finally:
            probe.close()
    return removed


def _worker_env(cpu_threads: int, gpu_ids: list) -> dict[str, str]:
    """The worker's environment. GPUs are Ray's to place: an actor given a share of one
    (num_gpus_per_game) has it alone visible, set by Ray; one given none sees none (Ray leaves
    CUDA_VISIBLE_DEVICES alone then, and the worker would take the node's GPU 0 unaccounted)."""
    from fleetd.supervision.launcher import worker_env

    env = worker_env(cpu_threads)
    if not gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

