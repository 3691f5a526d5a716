"""The Ray side of the supervision seams: launching, watching and signalling runs on a cluster.

`RayExecutor` is the Launcher, the Reactor and the ProcessProbe of fleetd/supervision/seams.py
and adoption.py at once; the supervisor, its state machine, run history, backoff, hang
watchdog and governor are the very code the local executor drives.

A run's handle (the `pid` the seams speak of) is its run id: unique across the cluster, where
worker pids are not. Each run is a detached actor named `run-<run id>-<game>` in the
`[cluster] namespace`; its recorded command line is ("ray-actor", namespace, name), which is
what a restarted daemon looks the actor up by. A run ends one of three ways:

- its worker exits: the exit code or signal, classified as locally (crash, completed, ...);
- its actor dies on a node that lives on: `crash`;
- its node dies (the GCS declared it dead): `node_lost`, and the game restarts from its
  newest checkpoint in shared storage on a node with room, after the usual backoff.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError, RayTaskError

from fleetd.cluster.actors import CONTROL, CONTROL_THREADS, RunActor, creation_error, report_hub, skew, versions
from fleetd.cluster.nodes import FactsReads, node_seen, on_node
from fleetd.cluster.storage import mirror, push_missing, put_lease
from fleetd.config import Settings
from fleetd.governor.footprint import Measured, Reading
from fleetd.operations.backup.target import Target
from fleetd.store.hosts import HOST_RESOURCE, names_its_host
from fleetd.store.records import NodeSeen
from fleetd.supervision.launcher import _prune_run_files, _run_spec, _write_spec
from fleetd.supervision.reactor import RefusedReports
from fleetd.supervision.seams import Exited, ExitStatus, Happening, Launch, LaunchError, Located, Reported, Spawned
from workers import lease

log = logging.getLogger(__name__)

HOST_SHARE = 0.0001  # of a node's `fleetd_host_<name>` (1 unit; Ray counts to 1e-4): pins a run there, up to 10,000 a host
ACTOR_PREFIX = "run-"
WAKE_SLICE_S = 0.1  # a wake-up from another thread is seen within this (ray.wait cannot be woken)
HUB_TAKE_S = 1.0  # a take waits this long for reports at most
REPORT_BATCH_S = 0.2  # as the local reactor: reports are read in batches at most this often
PROBE_TIMEOUT_S = 30.0
RUN_WAIT_S = 10.0  # a run's `wait` call returns None after this while its worker runs; asked again
RUN_THREADS = 8  # a run actor's threads for `wait` calls (`where`, `signal` and `measure` have their own)
CONNECT_CHECK_TIMEOUT_S = 60.0
MEASURE_TIMEOUT_S = 5.0  # a round of the workers' readings waits this long for every node's answers


class ClusterError(Exception):
    """The cluster cannot be used; the message says why and what to do."""


class ClusterUnreachable(ClusterError):
    """Nothing answers at the cluster's address: at boot Ray's own unit may not listen yet."""


def actor_name(game: str, run_id: int) -> str:
    return f"{ACTOR_PREFIX}{run_id:06d}-{game}"


def connect(settings: Settings) -> RayExecutor:
    cluster = settings.cluster
    try:
        ray.init(address=cluster.address, namespace=cluster.namespace, logging_level="WARNING", log_to_driver=False)
    except ConnectionError as exc:
        raise ClusterUnreachable(f"cannot connect to the Ray cluster at {cluster.address!r} ([cluster] address): {exc}") from None
    except (RuntimeError, ValueError) as exc:
        # Ray refuses a driver whose ray or Python version differs from the cluster's here.
        raise ClusterError(f"cannot connect to the Ray cluster at {cluster.address!r} ([cluster] address): {exc}") from None
    expected = versions()
    try:
        check_nodes(expected)
    except ClusterError:
        ray.shutdown()
        raise
    hub = report_hub(cluster.namespace)
    return RayExecutor(settings, hub, expected)


def check_nodes(expected: dict[str, str]) -> None:
    """Every node alive now that answers runs the daemon's ray, fleetd and protocol versions, or
    none starts. A node that does not answer within CONNECT_CHECK_TIMEOUT_S (hung, cut off, dying
    before the GCS has declared it dead) is no skew: it is named in the log and not waited for,
    and each run actor started there checks its versions itself (RunActor)."""
    probe = ray.remote(versions)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = {n["NodeID"]: on_node(probe, n["NodeID"]).remote() for n in nodes}
    if not refs:
        return
    # One deadline for all: the checks run at once, and a hung node costs it once, not each.
    answered, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=CONNECT_CHECK_TIMEOUT_S, fetch_local=True)
    problems, silent = [], []
    for node in nodes:
        label = f"{node['NodeManagerHostname']} ({node['NodeID'][:12]})"
        ref = refs[node["NodeID"]]
        if ref not in answered:
            silent.append(f"{label}: no answer within {CONNECT_CHECK_TIMEOUT_S:g}s")
            continue
        try:
            found = ray.get(ref)
        except RayTaskError as exc:  # it ran there and failed: fleetd is not what it should be there
            problems.append(f"{label}: the version check failed there: {creation_error(exc)}")
            continue
        except RayError as exc:  # it never ran: the node died, or could not start a worker
            silent.append(f"{label}: {exc}")
            continue
        differs = skew(expected, found)
        if differs:
            problems.append(f"{label}: {differs}")
    if problems:
        raise ClusterError("version skew between fleetd and the cluster's nodes, refused: " + "; ".join(problems)
                           + ". Install the same fleetd and ray on every node (docs/cluster.md)")
    if silent:
        log.warning("nodes that did not answer the version check, not checked now (hung, cut off or dying: each run "
                    "actor started there checks its versions itself): %s", "; ".join(silent))


@dataclass
class _Run:
    name: str
    actor: Any  # an ActorHandle
    wait_ref: Any  # resolves with the worker's exit status, or raises when the actor dies
    where_ref: Any | None = None
    node_id: str | None = None
    killed: bool = False  # fleetd killed the actor: its death is the SIGKILL asked for
    bounded_wait: bool = True  # False: an actor of an earlier fleetd, whose `wait` takes no timeout

    @property
    def game(self) -> str:
        """The run's game, as its actor is named (actor_name)."""
        return self.name[len(ACTOR_PREFIX):].split("-", 1)[1]


class RayExecutor:
    def __init__(self, settings: Settings, hub: Any, expected: dict[str, str]) -> None:
        self._settings = settings
        self._cluster = settings.cluster
        self._hub = hub
        self._expected = expected
        # Concurrency groups are fixed at ray.remote, not .options().
        self._remote_run = ray.remote(concurrency_groups={CONTROL: CONTROL_THREADS})(RunActor)
        self._runs: dict[int, _Run] = {}  # watched runs by handle (run id)
        self._ended: dict[int, _Run] = {}  # exited, until the supervisor's last SIGKILL ends the actor
        self._adoptable: dict[int, _Run] = {}  # found alive by the probe, not yet watched
        self._located: list[Located] = []  # runs whose node became known, for the next wait
        self._refs: dict[Any, tuple[str, int]] = {}  # ObjectRef -> ("wait" | "where", handle)
        self._hub_ref: Any | None = None
        self._hub_due = 0.0
        self._refused = RefusedReports(log)
        self._wake = threading.Event()
        self._swept = False
        self._hosts: dict[str, str] = {}  # node id -> its host's name, as `node_seen` names it
        self._named_hosts: dict[str, str] = {}  # node id -> the host its `fleetd_host_<name>` resource names
        self._probes: dict[str, tuple[Any, Any, float]] | None = None  # name -> (actor, its `where`, until when)
        self._facts = FactsReads()
        url = settings.cluster.storage_url
        self._storage = None if url is None else Target(url)  # games synced through it (fleetd/cluster/storage.py)

    # -- Launcher ----------------------------------------------------------------------------

    def spawn(self, launch: Launch, run_id: int) -> Spawned:
        spec = _run_spec(launch, run_id)
        logs = launch.game_dir / "logs"
        try:
            logs.mkdir(parents=True, exist_ok=True)
            _write_spec(logs / f"run-{run_id:06d}.spec.json", spec)  # read back at adoption
            if self._storage is None:  # a worker of an earlier run on a node cut off stops writing (workers/lease.py)
                lease.write(launch.game_dir / "checkpoints", run_id)
        except OSError as exc:
            raise LaunchError(f"{exc.strerror or exc} ({exc.filename}): is [cluster] storage mounted?") from None
        log_path = logs / f"run-{run_id:06d}.log"
        _prune_run_files(logs, self._settings.worker.log_keep_runs)
        name = actor_name(launch.game, run_id)
        worker = self._settings.worker
        argv = [worker.python, "-m", worker.module]
        storage = None
        if self._storage is not None:
            try:  # a model imported on the head, a restored backup: at the URL before the run pulls
                push_missing(self._storage, launch.game, launch.game_dir / "checkpoints")
                put_lease(self._storage, launch.game, run_id)
            except Exception as exc:  # noqa: BLE001 - fsspec's errors are its backend's
                raise LaunchError(f"cannot reach [cluster] storage {self._storage.url}: {exc}") from None
            cache = self._cluster.cache_dir
            storage = {"url": self._storage.url, "cache_dir": None if cache is None else str(cache)}
        try:
            actor = self._remote_run.options(name=name, **self._placement(launch.game, spec.cpu_threads, launch.host)).remote(
                spec.to_json(), str(log_path), argv, spec.cpu_threads, self._expected, self._hub, storage,
                self._cluster.namespace,
            )
        except (ValueError, RayError) as exc:
            raise LaunchError(f"Ray refused the actor {name}: {exc}") from None
        self._track(run_id, _Run(name, actor, None))
        return Spawned(run_id, time.time(), ("ray-actor", self._cluster.namespace, name), str(log_path))

    def _placement(self, game: str, cpu_threads: int, host: str | None = None) -> dict[str, Any]:
        """The actor's resources: the game's CPUs and GPU share, and the host whose governor
        admitted it (its node's `fleetd_host_<name>` resource, a sliver of it) unless the
        operator pinned the game in [cluster] pins."""
        cluster = self._cluster
        options: dict[str, Any] = dict(
            namespace=cluster.namespace, lifetime="detached", max_restarts=0, max_concurrency=RUN_THREADS,
            num_cpus=cpu_threads if cluster.num_cpus_per_game is None else cluster.num_cpus_per_game,
            num_gpus=cluster.num_gpus_per_game,
        )  # fmt: skip
        if cluster.pins.get(game):
            options["resources"] = dict(cluster.pins[game])
        elif host is not None and self._offers(host):
            options["resources"] = {HOST_RESOURCE + host: HOST_SHARE}
        if cluster.scheduling == "SPREAD":
            options["scheduling_strategy"] = "SPREAD"
        return options

    def stopped(self, pid: int) -> bool:
        return False  # the worker runs under an actor on some node: its state is not seen here

    def signal_group(self, pid: int, sig: int) -> None:
        run = self._runs.get(pid) or self._ended.pop(pid, None) or self._adoptable.pop(pid, None)
        if run is None:
            return  # gone already
        if sig != signal.SIGKILL:
            run.actor.signal.remote(int(sig))
            return
        # The worker's group first (the actor may be slow to die), then the actor itself: its
        # death takes the worker with it in any case (PR_SET_PDEATHSIG).
        run.killed = True
        run.actor.signal.remote(int(sig))
        ray.kill(run.actor, no_restart=True)

    # -- Reactor -----------------------------------------------------------------------------

    def watch(self, pid: int, own_child: bool) -> bool:
        if pid in self._runs:
            return True  # spawned by this daemon: watched from its first moment
        run = self._adoptable.pop(pid, None)
        if run is None:
            return False
        self._track(pid, run)
        if run.node_id is not None:  # the probe asked where it is: recorded with the adoption
            self._located.append(Located(pid, run.node_id, self._pinned_host(run.game, run.node_id)))
        return True

    def killing(self, pid: int) -> None:
        pass  # no OOM count is read for a cluster's runs

    def wake(self) -> None:
        self._wake.set()

    def wait(self, timeout: float | None) -> list[Happening]:
        if self._probes:  # the adoption is over: answers it did not take would go stale
            self._probes.clear()
        if not self._swept:
            self._swept = True
            self._sweep_orphans()
        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        while True:
            self._ask_hub()
            refs = list(self._refs)
            left = 0.0 if self._located else deadline - time.monotonic()  # one is waiting to be told
            ready = []
            if refs:
                ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, min(WAKE_SLICE_S, left)), fetch_local=False)
                if ready:
                    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
            else:
                self._wake.wait(max(0.0, min(WAKE_SLICE_S, left)))
            happenings = self._collect(ready)
            if happenings or self._wake.is_set() or time.monotonic() >= deadline:
                self._wake.clear()
                return happenings

    def close(self) -> None:
        """Runs are left as they are: a next daemon adopts the live ones."""
        self._runs.clear()
        self._refs.clear()
        ray.shutdown()

    # -- footprints ----------------------------------------------------------------------------

    def measure(self, timeout_s: float = MEASURE_TIMEOUT_S) -> list[Measured]:
        """Each watched run's worker as its node reads it (RunActor.measure), by the run's handle,
        with that node's sample and its host's name (as the GCS's listing names it): the footprints of a cluster's workers and its
        hosts' pressure. Called from the node readings job's thread; runs whose answer takes longer
        than `timeout_s` (a node hung), and actors of an earlier fleetd (no `measure`), are left out
        of this round."""
        refs: dict[Any, tuple[int, str]] = {}
        for handle, run in list(self._runs.items()):  # the supervisor's thread adds and ends runs
            try:
                refs[run.actor.measure.remote()] = (handle, run.game)
            except AttributeError:
                continue
        if not refs:
            return []
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s, fetch_local=True)
        answers = []
        for ref in ready:
            try:
                answers.append((*refs[ref], ray.get(ref)))
            except RayError:  # the actor died meanwhile: its watch says so
                continue
        if any(answer and answer["node_id"] not in self._hosts for _, _, answer in answers):
            self._listed()  # a node new since the last listing
        measured = []
        for handle, game, answer in answers:
            process = None if answer is None else next((p for p in answer["snapshot"].processes if p.pid == answer["pid"]), None)
            host = None if answer is None else self._hosts.get(answer["node_id"])
            if process is not None and host is not None:
                reading = Reading(game, handle, process.rss_bytes, process.gpu_memory_bytes)
                measured.append(Measured(reading, host, answer["snapshot"]))
        return measured

    # -- hosts ---------------------------------------------------------------------------------

    def nodes(self) -> list[NodeSeen]:
        """The cluster's nodes as the GCS lists them, each named for its host, with its host's
        facts where they were read on it (the hosts job's listing: fleetd/jobs.py)."""
        return self._facts.attach(self._listed())

    def _listed(self) -> list[NodeSeen]:
        seen = [node_seen(node) for node in ray.nodes()]
        self._hosts.update({n.node_id: n.host for n in seen})
        self._named_hosts.update({n.node_id: n.host for n in seen if names_its_host(n.host, n.resources)})
        return seen

    def _offers(self, host: str) -> bool:
        """A host named by its `fleetd_host_` resource can be pinned to; one named by its
        hostname only (a node started without it) is left to Ray's placement."""
        if host not in self._named_hosts.values():
            self._listed()
        return host in self._named_hosts.values()

    def _pinned_host(self, game: str, node_id: str) -> str | None:
        """The host a start of `game` is pinned to where that host is node `node_id`'s (its
        `fleetd_host_<name>` resource names it, as `_placement` pins): None for a game the operator
        pins ([cluster] pins) or a node named by its hostname only, which Ray places as it likes."""
        if self._cluster.pins.get(game):
            return None
        if node_id not in self._named_hosts:
            self._listed()
        return self._named_hosts.get(node_id)

    # -- ProcessProbe --------------------------------------------------------------------------

    def matches(self, pid: int, start_time: float, cmdline: tuple[str, ...]) -> bool:
        """A recorded run is alive when its named actor answers. One that exists but does not
        answer within PROBE_TIMEOUT_S is killed: never a second worker for a game beside the one
        we start."""
        if len(cmdline) != 3 or cmdline[0] != "ray-actor":
            return False
        _, namespace, name = cmdline
        probe = self._probe(namespace, name)
        if probe is None:
            return False  # no such actor: it ended (or its node died) while fleetd was down
        actor, asked, until = probe
        try:
            where = ray.get(asked, timeout=max(0.0, until - time.monotonic()))
        except (RayActorError, GetTimeoutError) as exc:
            log.warning("run actor %s did not answer (%s); killing it", name, exc)
            ray.kill(actor, no_restart=True)
            return False
        bounded = bool(where.get("bounded_wait"))
        if not bounded:
            log.warning("run actor %s was started by an earlier fleetd: it is waited on as that one was, "
                        "one call that returns at its worker's exit", name)
        self._adoptable[pid] = _Run(name, actor, None, node_id=where["node_id"], bounded_wait=bounded)
        return True

    def _probe(self, namespace: str, name: str) -> tuple[Any, Any, float] | None:
        """The actor named `name`, its `where` call and how long it is waited for; None when there
        is no such actor. The first probe asks every run actor of the namespace at once: the
        probes of a restarted daemon run before it is ready (systemd's start timeout), and the
        runs of a hung node would cost PROBE_TIMEOUT_S each, one after another."""
        if self._probes is None:
            self._probes = {}
            try:
                named = [entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                         if entry["namespace"] == namespace and entry["name"].startswith(ACTOR_PREFIX)]
            except Exception as exc:  # noqa: BLE001 - each run is looked up by its name then
                log.warning("could not list the cluster's actors: %s", exc)
                named = []
            until = time.monotonic() + PROBE_TIMEOUT_S
            for each in named:
                try:
                    actor = ray.get_actor(each, namespace=namespace)
                except ValueError:
                    continue  # ended since it was listed
                self._probes[each] = (actor, actor.where.remote(), until)
        if name in self._probes:
            return self._probes.pop(name)
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            return None
        return actor, actor.where.remote(), time.monotonic() + PROBE_TIMEOUT_S

    # -- inside --------------------------------------------------------------------------------

    def _track(self, handle: int, run: _Run) -> None:
        self._ask_exit(handle, run)
        if run.node_id is None:
            run.where_ref = run.actor.where.remote()
            self._refs[run.where_ref] = ("where", handle)
        self._runs[handle] = run

    def _ask_exit(self, handle: int, run: _Run) -> None:
        """One `wait` call at a time per run, each ending within RUN_WAIT_S: one left behind by
        this daemon's death ends by itself. An actor of an earlier fleetd (adopted across an
        upgrade) has a `wait` that takes no timeout: asked without one, it returns at the exit."""
        if run.bounded_wait:
            try:
                run.wait_ref = run.actor.wait.remote(RUN_WAIT_S)
            except TypeError:  # the handle knows its `wait` takes no timeout: an earlier fleetd's actor
                log.warning("run actor %s was started by an earlier fleetd: its exit is asked for without a timeout", run.name)
                run.bounded_wait = False
        if not run.bounded_wait:
            run.wait_ref = run.actor.wait.remote()
        self._refs[run.wait_ref] = ("wait", handle)

    def _ask_hub(self) -> None:
        if self._hub_ref is None and time.monotonic() >= self._hub_due:
            self._hub_ref = self._hub.take.remote(HUB_TAKE_S)
            self._refs[self._hub_ref] = ("hub", 0)

    def _collect(self, ready: list[Any]) -> list[Happening]:
        reports: list[Happening] = []
        located, self._located = self._located, []
        exits: list[Happening] = []
        for ref in ready:
            entry = self._refs.pop(ref, None)
            if entry is None:
                continue  # a `where` of a run whose exit came first in this batch
            kind, handle = entry
            if kind == "hub":
                reports.extend(self._take_reports(ref))
            elif kind == "where":
                where = self._where(handle, ref)
                if where is not None:
                    located.append(where)
            else:
                exited = self._exited(handle, ref)
                if exited is not None:
                    exits.append(exited)
        return located + reports + exits  # a run's last reports before its exit, as the worker sent them

    def _take_reports(self, ref: Any) -> list[Reported]:
        self._hub_ref = None
        self._hub_due = time.monotonic() + REPORT_BATCH_S
        try:
            batch = ray.get(ref)
        except RayError as exc:
            log.error("the report hub failed (%s); starting another", exc)
            self._hub = report_hub(self._cluster.namespace)  # or the one a run actor started already
            return []
        reports = []
        for datagram in batch:
            reported = self._refused.decode(datagram)
            if reported is not None:
                reports.append(reported)
        return reports

    def _where(self, handle: int, ref: Any) -> Located | None:
        run = self._runs.get(handle)
        try:
            where = ray.get(ref)
        except RayError:
            return None  # the actor died: its wait says how
        if run is None:
            return None
        run.node_id = where["node_id"]
        log.info("%s runs on node %s (%s), worker pid %s", run.name, where["node_id"][:12], where["hostname"], where["pid"])
        return Located(handle, where["node_id"], self._pinned_host(run.game, where["node_id"]))

    def _exited(self, handle: int, ref: Any) -> Exited | None:
        run = self._runs[handle]
        exc: RayActorError | None = None
        try:
            result = ray.get(ref)
        except ActorUnavailableError:
            # The connection to the actor broke: its node may be dying, or a network blip. Not
            # an ending yet: ask again; the GCS says `died` once it has declared it dead. A
            # call of ours still in the actor ends by itself within RUN_WAIT_S.
            if not run.killed:
                time.sleep(min(WAKE_SLICE_S, 0.05))
                self._ask_exit(handle, run)
                return None
            result = None
        except RayActorError as died:
            result, exc = None, died
        except RayTaskError as failed:
            # The actor lives but its `wait` raised (an interface this daemon does not know): the
            # run ends as a crash, logged, and the supervisor's SIGKILL ends the actor; the loop
            # goes on for every other run.
            log.error("%s: waiting for its exit failed: %s", run.name, creation_error(failed))
            self._end(handle, run)
            return Exited(handle, ExitStatus())
        else:
            if result is None:  # the worker runs on: ask again
                self._ask_exit(handle, run)
                return None
        self._end(handle, run)
        if result is None:
            return Exited(handle, self._actor_died(run, exc))
        if result.get("error"):
            log.warning("%s: %s", run.name, result["error"])
        return Exited(handle, ExitStatus(result.get("code"), result.get("signal")))

    def _end(self, handle: int, run: _Run) -> None:
        self._runs.pop(handle)
        if run.where_ref is not None:
            self._refs.pop(run.where_ref, None)
        self._ended[handle] = run
        self._mirror(run.name)

    def _mirror(self, name: str) -> None:
        """With a URL storage, the head's copy of the game's checkpoints follows the URL before
        the exit is handled: the checkpoint index, exports and the next spawn read it."""
        if self._storage is None:
            return
        game = name[len(ACTOR_PREFIX):].split("-", 1)[1]
        try:
            mirror(self._storage, game, self._settings.game_dir(game) / "checkpoints")
        except Exception as exc:  # noqa: BLE001 - the next run still pulls from the URL itself
            log.warning("%s: mirroring checkpoints from %s failed: %s", game, self._storage.url, exc)

    def _actor_died(self, run: _Run, exc: RayActorError | None) -> ExitStatus:
        if run.killed:
            return ExitStatus(signal=signal.SIGKILL)
        if exc is not None and exc.actor_init_failed:
            # Raised in its constructor (a version skew on its node, a bad spec): the node lives
            # on, whatever the message says; why is in the daemon's log.
            log.error("%s: its actor could not start: %s", run.name, creation_error(exc))
            return ExitStatus()
        if self._node_died(run):
            log.warning("%s: its node %s died", run.name, (run.node_id or "?")[:12])
            return ExitStatus(node_lost=True)
        log.warning("%s: its actor died on a live node: %s", run.name, exc)
        return ExitStatus()

    def _node_died(self, run: _Run) -> bool:
        """From the GCS's node table, for the node the actor was on: never from a message."""
        if run.node_id is None:  # never located: the GCS's actor table says where it was placed
            try:
                from ray._private.state import actors  # the GCS's actor table; no dashboard needed

                placed = actors(actor_id=run.actor._actor_id.hex())
                run.node_id = (placed.get("Address") or {}).get("NodeID") or None
            except Exception as exc:  # noqa: BLE001 - not known: not a node's loss
                log.warning("%s: could not read where its actor was: %s", run.name, exc)
            if run.node_id is None or set(run.node_id) <= {"0", "f"}:  # never placed (a nil id)
                run.node_id = None
                return False
        alive = {node["NodeID"]: node["Alive"] for node in ray.nodes()}
        return not alive.get(run.node_id, False)

    def _sweep_orphans(self) -> None:
        """Run actors nobody watches (their run was closed, or recorded on an earlier boot) are
        killed once at start: a game never trains twice."""
        watched = {run.name for run in self._runs.values()}
        try:
            named = ray.util.list_named_actors(all_namespaces=True)
        except RayError as exc:
            log.warning("could not list the cluster's actors: %s", exc)
            return
        for entry in named:
            if entry["namespace"] != self._cluster.namespace or not entry["name"].startswith(ACTOR_PREFIX):
                continue
            if entry["name"] in watched:
                continue
            try:
                ray.kill(ray.get_actor(entry["name"], namespace=entry["namespace"]), no_restart=True)
                log.warning("killed run actor %s: no open run of this daemon owns it", entry["name"])
            except ValueError:
                pass
