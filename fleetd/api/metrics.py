"""Prometheus metrics: read at scrape time from the store, the progress counters, the published
fleet snapshot and the telemetry. docs/metrics.md lists every one.

Names follow Prometheus conventions: a `fleetd_` prefix, base units (seconds, bytes, ratios, per
second), `_total` only on counters, and a counter never goes down while the daemon process lives
(a game's steps come from the recorder's counters, not from the store's figures, which rewind to
the checkpoint after a crash). The daemon's own CPU, memory and fds are the standard `process_*`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleetd.api.context import AppContext
from fleetd.governor.ladder import build_ladder
from fleetd.governor.stall import TELEMETRY_STALE_INTERVALS, sample_age
from fleetd.governor.snapshot import GovernorView
from fleetd.health.rules import Health
from fleetd.host.samples import Snapshot as TelemetrySnapshot
from fleetd.host.uptime import uptime_report
from fleetd.planning.rungs import RungSizing
from fleetd.planning.service import PlanReport, fleet_plan, live_pressure, live_sizing
from fleetd.states import Shown, shown, shown_rate
from fleetd.store.boots import count_reboots
from fleetd.store.games import count_games_wanting_slot, read_game_figures
from fleetd.store.hosts import read_hosts
from fleetd.store.records import GameFigures, HostRecord
from fleetd.supervision.counters import GameCounts, ProgressCounters

GAME_STATES = list(Shown)
SECONDS_PER_HOUR = 3600.0
PLAN_MAX_AGE_S = 60.0  # a plan covers every game: scrapes within a minute share one


class PlanCache:
    """The plan /metrics shows, made again once it is older than `PLAN_MAX_AGE_S`, or at once
    when what the live governor gives some rung's workers has changed since (`RungSizing.sized`,
    for the games the plan counted wanting a slot: a footprint's peak, a GPU seen, the games
    holding its slots that move some rung's envs or batch; the governor's rung or its sizing
    there), or when the count of games wanting a slot has (a game added, started, stopped, ended:
    the plan counted the others, and sized its rungs for them): not a minute on a stale host. A
    new peak that moves no rung's sizes (RSS peaks creep up at each telemetry sample) keeps the
    plan its minute."""

    def __init__(self, context: AppContext) -> None:
        self.context = context
        self.ladder = build_ladder(context.settings.fleet.tiers)  # the plan's governor's (stored_governor)
        self._latest: PlanReport | None = None
        self._key: tuple[object, ...] | None = None

    def get(self, now: datetime) -> PlanReport:
        latest, context = self._latest, self.context
        snapshot = context.snapshot
        live = live_sizing(snapshot)
        sizing = RungSizing(live, context.settings)
        with context.db.transaction() as session:  # one COUNT a scrape; the plan reads every game
            wanting = count_games_wanting_slot(session)
        if (latest is None or (now - latest.plan.at).total_seconds() >= PLAN_MAX_AGE_S or now < latest.plan.at
                or (wanting, sizing.sized(self.ladder, latest.wanting)) != self._key):  # fmt: skip
            latest = fleet_plan(context.db, context.settings, context.daemon.boot_pk, context.daemon.started_at, now,
                                pressure_seen=live_pressure(snapshot), live=live)  # fmt: skip
            # The count as the store gives it when the plan was made, not the plan's own (which
            # leaves out a game past its goal whose worker has not ended yet): a key that moves
            # only when the games do.
            self._latest, self._key = latest, (wanting, sizing.sized(self.ladder, latest.wanting))
        return latest


class TelemetryAge:
    """The telemetry sample's age, and whether it is stale, as the governor judges it (the same
    `sample_age`, counted from the API's start rather than the governor's first look, a moment
    before it). One per app: /metrics and `GET /api/v1/fleet` say the same."""

    def __init__(self, context: AppContext) -> None:
        self.clock = context.clock
        self._started = context.clock.monotonic()
        self.stale_after_s = TELEMETRY_STALE_INTERVALS * context.settings.fleet.telemetry_interval_s

    def judge(self, snapshot: TelemetrySnapshot | None) -> tuple[float | None, bool]:
        """The sample's age (None before the first) and whether it is stale. The age too counts
        from no earlier than the API's start: the gauge (`> 30` alerts on it) and the fleet's
        `age_s` say what availability says."""
        if snapshot is None:
            return None, False
        age = sample_age(snapshot, self.clock, self._started)
        return age, age > self.stale_after_s


class FleetCollector:
    """The fleet-wide families, through prometheus_client (a few dozen samples)."""

    def __init__(self, context: AppContext, telemetry_age: TelemetryAge) -> None:
        self.context = context
        self.plans = PlanCache(context)
        self.telemetry_age = telemetry_age

    def collect(self) -> Iterator[Metric]:
        now = self.context.clock.now()
        with self.context.db.transaction() as session:
            reboots = count_reboots(session)
            hosts = read_hosts(session)
        yield from uptime_metrics(self.context, reboots, now)
        yield from host_metrics(hosts)
        yield from plan_metrics(self.plans.get(now))
        snapshot = self.context.snapshot
        if snapshot is not None:
            yield from fleet_metrics(snapshot.governor)
        telemetry = self.context.telemetry
        latest = telemetry.latest if telemetry is not None else None
        yield from gpu_metrics(latest, *self.telemetry_age.judge(latest))


class Exposition:
    """All of /metrics. The per-game families are written here directly: 10,000 games are some
    190,000 samples, which prometheus_client's generic writer takes seconds over (issue #13
    item 6); game names are slugs, so their label values need no escaping."""

    def __init__(self, context: AppContext) -> None:
        self.context = context
        self.telemetry_age = TelemetryAge(context)
        # A read-only app (no supervisor) still exports counters: from the store's figures.
        self.counters = context.counters if context.counters is not None else ProgressCounters()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FleetCollector(context, self.telemetry_age))
        ProcessCollector(registry=self.registry)  # the standard process_* names: CPU, memory, fds

    def render(self) -> bytes:
        now = self.context.clock.now()
        with self.context.db.transaction() as session:
            games = read_game_figures(session)
        counts = self.counters.read({g.name: (g.steps, g.episodes) for g in games})
        return generate_latest(self.registry) + game_exposition(games, counts, now).encode()


def game_exposition(games: list[GameFigures], counts: dict[str, GameCounts], now: datetime) -> str:
    lines: list[str] = []
    for family in GAME_FAMILIES:
        lines.append(f"# HELP {family.name} {family.doc}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for game in games:
            lines.extend(family.lines(game, counts[game.name], now))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class GameFamily:
    name: str  # as exposed: a counter's ends in _total
    kind: str  # "counter" or "gauge"
    doc: str
    value: Callable[[GameFigures, GameCounts, datetime], float | None]  # None: no sample

    def lines(self, game: GameFigures, count: GameCounts, now: datetime) -> list[str]:
        value = self.value(game, count, now)
        return [] if value is None else [f'{self.name}{{game="{game.name}"}} {_number(value)}']


@dataclass(frozen=True)
class StateFamily:
    name: str = "fleetd_game_state"
    kind: str = "gauge"
    doc: str = "1 for the game's current state, 0 for the others"

    def lines(self, game: GameFigures, _count: GameCounts, _now: datetime) -> list[str]:
        current = _shown(game)
        prefix = f'{self.name}{{game="{game.name}",state="'
        return [f'{prefix}{state}"}} {"1.0" if state is current else "0.0"}' for state in GAME_STATES]


@dataclass(frozen=True)
class HealthFamily:
    """One sample per learning-health state, as StateFamily does for the process state."""

    name: str = "fleetd_game_health"
    kind: str = "gauge"
    doc: str = "1 for the game's learning health (learning, plateau, collapsed, rolled_back, held), 0 for the others"

    def lines(self, game: GameFigures, _count: GameCounts, _now: datetime) -> list[str]:
        current = Health(game.health) if game.health else Health.LEARNING
        prefix = f'{self.name}{{game="{game.name}",health="'
        return [f'{prefix}{health}"}} {"1.0" if health is current else "0.0"}' for health in Health]


def _checkpoint_age(game: GameFigures, _count: GameCounts, now: datetime) -> float | None:
    return None if game.checkpoint_at is None else max(0.0, (now - game.checkpoint_at).total_seconds())


def _shown(game: GameFigures) -> Shown:
    return shown(game.desired, game.state, game.admitted_at is not None)


def _episodes_per_second(game: GameFigures, _count: GameCounts, _now: datetime) -> float | None:
    """The worker's recent rate, only while the game runs (`shown_rate`, as the API says it)."""
    rate = shown_rate(game.episodes_per_hour, _shown(game))
    return None if rate is None else rate / SECONDS_PER_HOUR


GAME_FAMILIES: tuple[GameFamily | StateFamily | HealthFamily, ...] = (
    StateFamily(),
    HealthFamily(),
    GameFamily("fleetd_game_steps_total", "counter", "Environment steps trained, as this daemon process saw them",
               lambda g, c, _: c.steps),
    GameFamily("fleetd_game_steps_lost_total", "counter", "Steps lost to restarts from an older checkpoint",
               lambda g, c, _: c.steps_lost),
    GameFamily("fleetd_game_episodes_total", "counter", "Whole episodes played, as this daemon process saw them",
               lambda g, c, _: c.episodes),
    GameFamily("fleetd_game_episodes_lost_total", "counter", "Episodes lost to restarts from an older checkpoint",
               lambda g, c, _: c.episodes_lost),
    GameFamily("fleetd_game_restarts_total", "counter", "Automatic restarts of the game's worker",
               lambda g, c, _: g.restarts),
    GameFamily("fleetd_game_progress_steps", "gauge", "The game's step count (back to its checkpoint after a crash)",
               lambda g, c, _: g.steps),
    GameFamily("fleetd_game_episodes_per_second", "gauge", "Episodes per second, the worker's recent rate, while running",
               _episodes_per_second),
    GameFamily("fleetd_game_mean_return", "gauge", "Mean return over the last 100 episodes",
               lambda g, c, _: g.mean_reward_100),
    GameFamily("fleetd_game_best_return", "gauge", "Best episode return", lambda g, c, _: g.best_reward),
    GameFamily("fleetd_game_eval_return", "gauge", "Mean return of the latest deterministic evaluation",
               lambda g, c, _: g.eval_return),
    GameFamily("fleetd_game_checkpoint_age_seconds", "gauge", "Seconds since the newest verified checkpoint",
               _checkpoint_age),
)  # fmt: skip


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def uptime_metrics(context: AppContext, reboots: int, now: datetime) -> Iterator[Metric]:
    report = uptime_report(context.db, context.daemon.boot_pk, context.daemon.started_at, now)
    # Every reboot ever recorded: boots are never pruned, and one daemon process sees none
    # happen (a reboot ends it), so this never goes down while the process lives.
    total = _counter("fleetd_host_reboots", "Host reboots recorded since fleetd first ran here", [])
    total.add_metric([], reboots)
    recent = _gauge("fleetd_host_recent_reboots", "Host reboots in the last window", ["window"])
    availability = _gauge("fleetd_availability_ratio", "Share of observed time the host was up", ["window"])
    for window, stats in (("24h", report.day), ("7d", report.week)):
        recent.add_metric([window], stats.reboots)
        if stats.availability is not None:
            availability.add_metric([window], stats.availability)
    yield from (total, recent, availability)
    yield GaugeMetricFamily("fleetd_host_uptime_seconds", "Seconds since the host booted", value=report.host_uptime_s)
    yield GaugeMetricFamily("fleetd_daemon_uptime_seconds", "Seconds since the daemon started", value=report.daemon_uptime_s)


def host_metrics(hosts: list[HostRecord]) -> Iterator[Metric]:
    """Per cluster host ([cluster] backend = "ray"): up, lives of its Ray node, downtime."""
    up = _gauge("fleetd_cluster_host_up", "1 while the host's Ray node is alive", ["host"])
    joins = _counter("fleetd_cluster_host_joins", "Times the host's Ray node joined the cluster", ["host"])
    down = _counter("fleetd_cluster_host_downtime_seconds", "Time between the host's Ray node lives", ["host"])
    for host in hosts:
        up.add_metric([host.name], 1.0 if host.alive else 0.0)
        joins.add_metric([host.name], float(len(host.boots)))
        down.add_metric([host.name], sum(host.downtimes_s()))
    yield from (up, joins, down)


def fleet_metrics(governor: GovernorView) -> Iterator[Metric]:
    tier = _gauge("fleetd_fleet_tier", "1 for the tier in force", ["tier", "mode"])
    tier.add_metric([governor.tier, governor.mode], 1.0)
    yield tier
    yield GaugeMetricFamily("fleetd_fleet_allowed_games", "Games the governor allows now", value=governor.allowed)
    yield GaugeMetricFamily("fleetd_fleet_admitted_games", "Games admitted", value=len(governor.admitted))
    yield GaugeMetricFamily("fleetd_fleet_pending_games", "Games waiting for admission", value=len(governor.pending))
    yield GaugeMetricFamily("fleetd_fleet_pressure_reasons", "Limits the telemetry reads over now (on a cluster, every "
                            "host's): 0 is no pressure", value=len(governor.pressure))
    pressure = _gauge("fleetd_cluster_host_pressure_reasons", "Limits the host's own node reads over now", ["host"])
    for host in governor.hosts:  # none on one host, as the other per-host families
        pressure.add_metric([host.name], float(len(host.pressure)))
    yield pressure


def plan_metrics(report: PlanReport) -> Iterator[Metric]:
    """The plan (docs/planning.md): each family always declared, a sample only where it is known."""
    result = report.plan
    families = (
        ("fleetd_plan_time_to_all_goals_seconds", "Wall seconds until every game's goal, queue and reboots included",
         None if result.hours_to_all_goals is None else result.hours_to_all_goals * SECONDS_PER_HOUR),
        ("fleetd_plan_downtime_ratio", "Share of wall time the host's reboots take, from its reboot log",
         result.downtime.share),
        ("fleetd_plan_cost_to_all_goals", "What the host costs until every goal, in [costs] currency (with a price set)",
         result.cost_to_all_goals),
        ("fleetd_plan_error_ratio", "Median of |ETA error| / predicted hours over the games judged",
         report.median_error),
    )  # fmt: skip
    for name, doc, value in families:
        family = _gauge(name, doc)
        if value is not None:
            family.add_metric([], value)
        yield family


def gpu_metrics(snapshot: TelemetrySnapshot | None, age_s: float | None = None, stale: bool = False) -> Iterator[Metric]:
    """The GPU families. `age_s`: the sample's age. `stale`: older than 3 telemetry intervals (its
    job stalled, a hung NVML call): its readings are no longer what the GPUs do, so available is
    0 and they are left out, as when NVML does not answer. A GPU lost stays lost until a reset
    or a reboot: `fleetd_gpu_lost` still says so."""
    if age_s is not None:
        yield GaugeMetricFamily("fleetd_gpu_telemetry_age_seconds", "Seconds since the telemetry's newest sample",
                                value=age_s)
    available = snapshot is not None and snapshot.gpu_available and not stale
    yield GaugeMetricFamily("fleetd_gpu_telemetry_available", "1 when NVML answers and its sample is fresh",
                            value=1.0 if available else 0.0)
    # A GPU lost (NVML: GPU is lost) has no readings, but is no silence: 1 each, whether NVML
    # answers for the others or the read failed as a whole.
    lost = _gauge("fleetd_gpu_lost", "1 for a GPU NVML says is lost (fallen off the bus)", ["gpu"])
    for gpu in () if snapshot is None else snapshot.gpus:
        if gpu.lost:
            lost.add_metric([str(gpu.index)], 1.0)
    yield lost
    if snapshot is None or not available:
        return
    labels = ["gpu", "name"]
    util = _gauge("fleetd_gpu_utilization_ratio", "GPU utilization, 0 to 1", labels)
    used = _gauge("fleetd_gpu_memory_used_bytes", "GPU memory in use", labels)
    total = _gauge("fleetd_gpu_memory_total_bytes", "GPU memory in all", labels)
    temp = _gauge("fleetd_gpu_temperature_celsius", "GPU temperature", labels)
    for gpu in snapshot.read_gpus:  # a lost GPU has no readings
        key = [str(gpu.index), gpu.name]
        if gpu.utilization_pct is not None:
            util.add_metric(key, gpu.utilization_pct / 100)
        used.add_metric(key, gpu.memory_used_bytes)
        total.add_metric(key, gpu.memory_total_bytes)
        if gpu.temperature_c is not None:
            temp.add_metric(key, gpu.temperature_c)
    yield from (util, used, total, temp)
