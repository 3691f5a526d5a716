"""Prometheus metrics: read at scrape time from the store, the governor and the telemetry.

Names follow Prometheus conventions: a `fleetd_` prefix, base units (seconds, bytes, ratios),
`_total` on counters, labels for the game and the GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleetd.api.context import AppContext
from fleetd.games import shown_state
from fleetd.governor.snapshot import GovernorView
from fleetd.states import Shown
from fleetd.store.games import read_games
from fleetd.store.records import GameRecord
from fleetd.telemetry import Snapshot as TelemetrySnapshot
from fleetd.uptime import uptime_report

GAME_STATES = list(Shown)


class FleetCollector:
    def __init__(self, context: AppContext) -> None:
        self.context = context

    def collect(self) -> Iterator[Metric]:
        now = self.context.clock.now()
        with self.context.db.transaction() as session:
            games = read_games(session)
        yield from game_metrics(games, now)
        yield from uptime_metrics(self.context, now)
        if self.context.snapshot is not None:
            yield from fleet_metrics(self.context.snapshot.governor)
        telemetry = self.context.telemetry
        yield from gpu_metrics(telemetry.latest if telemetry is not None else None)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def game_metrics(games: list[GameRecord], now: datetime) -> Iterator[Metric]:
    state = _gauge("fleetd_game_state", "1 for the game's current state", ["game", "state"])
    steps = CounterMetricFamily("fleetd_game_steps", "Environment steps trained", labels=["game"])
    episodes = CounterMetricFamily("fleetd_game_episodes", "Whole episodes played", labels=["game"])
    restarts = CounterMetricFamily("fleetd_game_restarts", "Automatic restarts of the worker", labels=["game"])
    rate = _gauge("fleetd_game_episodes_per_hour", "Episodes per hour, worker's recent rate", ["game"])
    mean = _gauge("fleetd_game_mean_return", "Mean return over the last 100 episodes", ["game"])
    best = _gauge("fleetd_game_best_return", "Best episode return", ["game"])
    age = _gauge("fleetd_game_checkpoint_age_seconds", "Seconds since the newest verified checkpoint", ["game"])
    for game in games:
        shown = shown_state(game)
        for value in GAME_STATES:
            state.add_metric([game.name, value], 1.0 if value == shown else 0.0)
        steps.add_metric([game.name], game.steps)
        episodes.add_metric([game.name], game.episodes)
        restarts.add_metric([game.name], game.restarts)
        _maybe(rate, game.name, game.episodes_per_hour)
        _maybe(mean, game.name, game.mean_reward_100)
        _maybe(best, game.name, game.best_reward)
        if game.last_checkpoint is not None:
            age.add_metric([game.name], max(0.0, (now - game.last_checkpoint.created_at).total_seconds()))
    yield from (state, steps, episodes, restarts, rate, mean, best, age)


def _maybe(family: GaugeMetricFamily, label: str, value: float | None) -> None:
    if value is not None:
        family.add_metric([label], value)


def uptime_metrics(context: AppContext, now: datetime) -> Iterator[Metric]:
    report = uptime_report(context.db, context.daemon.boot_pk, context.daemon.started_at, now)
    reboots = CounterMetricFamily("fleetd_host_reboots", "Host reboots recorded in the last 7 days", labels=[])
    reboots.add_metric([], report.week.reboots)
    yield reboots
    yield GaugeMetricFamily("fleetd_host_uptime_seconds", "Seconds since the host booted", value=report.host_uptime_s)
    yield GaugeMetricFamily("fleetd_daemon_uptime_seconds", "Seconds since the daemon started", value=report.daemon_uptime_s)
    availability = _gauge("fleetd_availability_ratio", "Share of observed time the host was up", ["window"])
    for window, stats in (("24h", report.day), ("7d", report.week)):
        if stats.availability is not None:
            availability.add_metric([window], stats.availability)
    yield availability


def fleet_metrics(governor: GovernorView) -> Iterator[Metric]:
    tier = _gauge("fleetd_fleet_tier", "1 for the tier in force", ["tier", "mode"])
    tier.add_metric([governor.tier, governor.mode], 1.0)
    yield tier
    yield GaugeMetricFamily("fleetd_fleet_allowed_games", "Games the governor allows now", value=governor.allowed)
    yield GaugeMetricFamily("fleetd_fleet_admitted_games", "Games admitted", value=len(governor.admitted))
    yield GaugeMetricFamily("fleetd_fleet_pending_games", "Games waiting for admission", value=len(governor.pending))


def gpu_metrics(snapshot: TelemetrySnapshot | None) -> Iterator[Metric]:
    available = snapshot is not None and snapshot.gpu_available
    yield GaugeMetricFamily("fleetd_gpu_telemetry_available", "1 when NVML answers", value=1.0 if available else 0.0)
    if not available:
        return
    labels = ["gpu", "name"]
    util = _gauge("fleetd_gpu_utilization_ratio", "GPU utilization, 0 to 1", labels)
    used = _gauge("fleetd_gpu_memory_used_bytes", "GPU memory in use", labels)
    total = _gauge("fleetd_gpu_memory_total_bytes", "GPU memory in all", labels)
    temp = _gauge("fleetd_gpu_temperature_celsius", "GPU temperature", labels)
    for gpu in snapshot.gpus:
        key = [str(gpu.index), gpu.name]
        if gpu.utilization_pct is not None:
            util.add_metric(key, gpu.utilization_pct / 100)
        used.add_metric(key, gpu.memory_used_bytes)
        total.add_metric(key, gpu.memory_total_bytes)
        if gpu.temperature_c is not None:
            temp.add_metric(key, gpu.temperature_c)
    yield from (util, used, total, temp)


def build_registry(context: AppContext) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(context))
    ProcessCollector(namespace="fleetd", registry=registry)  # the daemon's own CPU, memory, fds
    return registry
