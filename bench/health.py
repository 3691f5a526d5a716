"""Learning health (docs/learning-health.md) through the real daemon: how soon a collapse is seen
and recovered from, and how many false alarms the defaults raise on healthy runs.

`collapse`: per seed, PPO on CartPole-v1 trains to a good evaluation return; its learning rate is
then set absurdly high (`PATCH /games`, restart) and the daemon's own health watch has to see it:
env steps from the change to the `learning_collapse` event (detection), and from the change to
the first evaluation after the rollback within 10% of the best (recovery, the steps spent
collapsing plus those trained after the rollback). The rollback's learning-rate scale is set to
bring the absurd rate back to a sane one, so that recovery is possible at all.

`healthy`: PPO and DQN on CartPole-v1 and PPO on Breakout-v5 (EnvPool), each to a step goal with
the default health settings; the daemon's collapse and plateau verdicts on them are false alarms.
Every run's evaluations (from the worker's log) and training returns (polled) are kept, and
`--sweep` replays them through the rules for other settings (pure, no training).

    PYTHONPATH=. python bench/health.py collapse [--seeds 1 2 3] [--rules e2e|defaults] [--json out.json]
    PYTHONPATH=. python bench/health.py healthy [--seeds 1 2] [--cases ppo-cartpole ...] [--json out.json]
    PYTHONPATH=. python bench/health.py sweep runs.json [...]

Figures in docs/benchmarks.md#learning-health-benchhealthpy-issue-24. Run it under the heavy lock
(or under `nice -n 10` beside other work: the figures are env steps).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.learning import add_seeded_game, daemon_config, done, machine, patiently, wait_for, write_json  # noqa: E402
from fleetd.health.rules import Action, Evaluation, HealthRecord, observe  # noqa: E402
from fleetd.health.settings import HealthSettings  # noqa: E402
from tests.daemon_harness import Daemon, kill_leftover_workers  # noqa: E402

EVAL_LINE = re.compile(r"evaluation at (\d+) steps: mean return (-?[\d.]+)")
CARTPOLE = {"num_envs": 8, "eval_interval_steps": 2048, "eval_episodes": 4}
# The collapse scenario: the e2e test's (tests/test_health_e2e.py), an absurd learning rate
# that the rollback's scale brings back to 1e-3 (the zoo's).
COLLAPSE_HEALTH = {  # --rules: e2e (the test's quick settings) or defaults (only the rollback's scale set)
    "e2e": {"warmup_evals": 2, "collapse_evals": 2, "min_rise": 10, "rollback_lr_scale": 0.0002, "plateau_gain": 0.3},
    "defaults": {"rollback_lr_scale": 0.0002},
}
ABSURD_LR, GOOD = 5.0, 400.0
HEALTHY = {  # name: (body, step goal); the health settings are the defaults
    "ppo-cartpole": ({"env_id": "CartPole-v1", "algo": "ppo", "hyperparams": CARTPOLE}, 60_000),
    "dqn-cartpole": ({"env_id": "CartPole-v1", "algo": "dqn", "hyperparams": CARTPOLE}, 30_000),
    "ppo-breakout": ({"env_id": "Breakout-v5", "algo": "ppo",
                      "hyperparams": {"num_envs": 8, "eval_interval_steps": 6144, "eval_episodes": 3}}, 30_000),
}


@dataclass
class Trace:
    """One run's evaluations: (steps, eval return, training return then)."""

    case: str
    seed: int
    evaluations: list[tuple[int, float, float | None]] = field(default_factory=list)
    collapses: int = 0  # the daemon's learning_collapse events
    plateaus: int = 0
    detect_steps: int | None = None  # collapse scenario: steps from the change to detection
    recover_steps: int | None = None  # ... to the first evaluation within 10% of the best
    best: float | None = None
    seconds: float = 0.0


def run_logs(daemon: Daemon, name: str) -> list[Path]:
    return sorted((daemon.config.state_dir / "games" / name / "logs").glob("run-*.log"))


def evaluations(daemon: Daemon, name: str, curve: list[tuple[int, float | None]],
                first_run: int = 0) -> list[tuple[int, float, float | None]]:
    """The worker's evaluations from its run logs (from the `first_run`-th on), each with the
    training return polled last at or before its steps."""
    logs = run_logs(daemon, name)[first_run:]
    found = [(int(m[1]), float(m[2])) for log in logs for m in EVAL_LINE.finditer(log.read_text(errors="replace"))]
    return [(steps, value, _train_at(curve, steps)) for steps, value in found]


def _train_at(curve: list[tuple[int, float | None]], steps: int) -> float | None:
    before = [train for at, train in curve if at <= steps and train is not None]
    return before[-1] if before else None


def events(daemon: Daemon, name: str, kind: str) -> list[dict]:
    return patiently(lambda: daemon.get(f"/api/v1/events?game={name}&kind={kind}&limit=100")).json()["items"]


def poll(daemon: Daemon, name: str, curve: list, until, timeout: float, what: str) -> dict:
    def check():
        game = patiently(lambda: daemon.game(name))
        curve.append((game["steps"], game["mean_reward_100"]))
        return game if until(game) else None
    return wait_for(check, timeout, what, daemon)


# -- healthy runs ------------------------------------------------------------------------------

@contextmanager
def fresh_daemon() -> Iterator[Daemon]:
    """A healthy daemon of its own for one run; stopped, its workers ended, its state removed."""
    daemon = Daemon(daemon_config())
    try:
        daemon.wait_healthy(180)
        yield daemon
    finally:
        daemon.ensure_stopped()
        kill_leftover_workers(daemon.config)
        shutil.rmtree(daemon.config.root, ignore_errors=True)


def healthy_run(case: str, seed: int) -> Trace:
    body, goal = HEALTHY[case]
    started, curve = time.monotonic(), []
    with fresh_daemon() as daemon:
        add_seeded_game(daemon, {**body, "name": case, "total_timesteps": goal}, seed)
        poll(daemon, case, curve, done, 1800, "done")
        trace = Trace(case, seed, evaluations(daemon, case, curve), len(events(daemon, case, "learning_collapse")),
                      len(events(daemon, case, "plateau")))
    trace.seconds = time.monotonic() - started
    return trace


# -- the collapse scenario ---------------------------------------------------------------------

def collapse_run(seed: int, rules: str) -> Trace:
    name = "cart"
    started, curve = time.monotonic(), []
    body = {"name": name, "env_id": "CartPole-v1", "algo": "ppo", "hyperparams": CARTPOLE,
            "health_settings": COLLAPSE_HEALTH[rules]}
    with fresh_daemon() as daemon:
        add_seeded_game(daemon, body, seed)
        poll(daemon, name, curve, lambda g: (g["best_eval_return"] or 0) >= GOOD, 900, f"evaluated {GOOD}")
        changed_at = patiently(lambda: daemon.game(name))["steps"]
        set_learning_rate(daemon, name, ABSURD_LR)
        poll(daemon, name, curve, lambda g: g["health"] == "held" or (g["health"] == "rolled_back" and g["state"] == "running"),
             600, "rolled back")
        trace = collapse_trace(daemon, name, seed, curve, changed_at)
    trace.seconds = time.monotonic() - started
    return trace


def set_learning_rate(daemon: Daemon, name: str, value: float) -> None:
    """`fleetd games set NAME learning_rate=VALUE --restart`, as its PATCH."""
    headers = {"Authorization": f"Bearer {daemon.config.token()}"}
    body = {"algo": "ppo", "hyperparams": {**CARTPOLE, "learning_rate": value}}
    url = f"{daemon.config.url}/api/v1/games/{name}?restart=true"
    response = patiently(lambda: httpx.patch(url, json=body, headers=headers, timeout=30))
    assert response.status_code == 200, response.text


def collapse_trace(daemon: Daemon, name: str, seed: int, curve: list, changed_at: int) -> Trace:
    """Detection from the collapse event; recovery from the evaluations of the run after the
    rollback (the newest run log once the game is back to running)."""
    [collapse] = events(daemon, name, "learning_collapse")
    best, detected = collapse["details"]["best"], collapse["details"]["steps"]
    [rollback] = events(daemon, name, "learning_rollback")
    to_steps, rollback_run = rollback["details"]["to_steps"], len(run_logs(daemon, name)) - 1
    trace = Trace("collapse", seed, detect_steps=detected - changed_at, best=best, collapses=1)

    def recovered():
        poll(daemon, name, curve, lambda g: True, 60, "answering")
        after = evaluations(daemon, name, curve, rollback_run)
        return next((steps for steps, value, _ in after if value >= best - 0.1 * abs(best)), None)
    try:
        trace.recover_steps = trace.detect_steps + wait_for(recovered, 300, "recovered", daemon) - to_steps
    except TimeoutError:
        pass
    trace.evaluations = evaluations(daemon, name, curve)
    return trace


# -- replaying evaluations through the rules ---------------------------------------------------

def verdicts(trace: Trace, settings: HealthSettings) -> list[Action]:
    """The rules' verdicts over a run's evaluations (no rollback: a healthy run's verdicts)."""
    record, seen = HealthRecord(), []
    for steps, value, train in trace.evaluations:
        record, verdict = observe(record, Evaluation(steps, value, train), settings)
        seen.append(verdict.action)
    return seen


SWEEP = {"collapse_fraction": (0.3, 0.5, 0.7), "collapse_evals": (1, 2, 3), "warmup_evals": (3, 5)}


def sweep(traces: list[Trace]) -> list[dict]:
    """False collapses on the healthy traces for each combination, with and without the training
    return's confirmation."""
    rows = []
    for values in itertools.product(*SWEEP.values()):
        settings = HealthSettings(**dict(zip(SWEEP, values)))
        for with_train in (True, False):
            alarms = sum(verdicts(_without_train(t) if not with_train else t, settings).count(Action.ROLLBACK)
                         for t in traces if t.case != "collapse")
            rows.append({**dict(zip(SWEEP, values)), "train_return": with_train, "false_collapses": alarms})
    return rows


def _without_train(trace: Trace) -> Trace:
    return Trace(trace.case, trace.seed, [(s, v, None) for s, v, _ in trace.evaluations])


# -- reporting -----------------------------------------------------------------------------------

def print_traces(traces: list[Trace]) -> None:
    print(f"{'case':<14}{'seed':>5}{'evals':>7}{'collapses':>10}{'plateaus':>9}{'detect':>9}{'recover':>9}{'best':>8}{'s':>6}")
    for t in traces:
        print(f"{t.case:<14}{t.seed:>5}{len(t.evaluations):>7}{t.collapses:>10}{t.plateaus:>9}"
              f"{_n(t.detect_steps):>9}{_n(t.recover_steps):>9}{_n(t.best):>8}{t.seconds:>6.0f}")


def _n(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_sweep(rows: list[dict]) -> None:
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))


def load(paths: list[str]) -> list[Trace]:
    traces = []
    for path in paths:
        for item in json.loads(Path(path).read_text())["traces"]:
            item["evaluations"] = [tuple(e) for e in item["evaluations"]]
            traces.append(Trace(**item))
    return traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=("collapse", "healthy", "sweep"))
    parser.add_argument("inputs", nargs="*", help="sweep: JSON files written by --json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--cases", nargs="+", default=list(HEALTHY), choices=list(HEALTHY))
    parser.add_argument("--rules", choices=list(COLLAPSE_HEALTH), default="e2e", help="collapse: the health settings")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.scenario == "sweep":
        print_sweep(sweep(load(args.inputs)))
        return
    if args.scenario == "collapse":
        traces = [collapse_run(seed, args.rules) for seed in args.seeds]
    else:
        traces = [healthy_run(case, seed) for case in args.cases for seed in args.seeds
                  if case != "ppo-breakout" or seed == args.seeds[0]]
    print_traces(traces)
    if args.scenario == "collapse":
        detect = [t.detect_steps for t in traces if t.detect_steps is not None]
        recover = [t.recover_steps for t in traces if t.recover_steps is not None]
        print(f"median steps to detection {statistics.median(detect):.0f}; to recovery "
              f"{statistics.median(recover) if recover else float('nan'):.0f} ({len(recover)}/{len(traces)} recovered)")
    print(machine())
    if args.json:
        write_json(args.json, {"scenario": args.scenario, "rules": args.rules, "machine": machine(),
                               "traces": [asdict(t) for t in traces]})


if __name__ == "__main__":
    main()
