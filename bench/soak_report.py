"""bench/soak.py's report: the fault table and check lines as text, and the learning curves of
the faulted and the baseline fleet side by side as a PNG."""

from __future__ import annotations

from pathlib import Path

from bench.fleet_faults import check_lines

KINDS = ("worker_kill", "worker_stop", "daemon_kill", "power_cut", "disk_full", "corrupt", "memory_kill")


def render(report: dict) -> str:
    o = report["options"]  # bench.soak.Options
    counts: dict[str, int] = {}
    for done in report["faults"]:
        counts[done.fault.kind] = counts.get(done.fault.kind, 0) + 1
    lines = [
        f"fleetd soak, {report['machine']}",
        f"seed {o.seed}; {o.minutes:g} min planned, {report['duration_s'] / 60:.1f} min run; "
        f"{'short mode, ' if o.short else ''}games {', '.join(env for _, env in o.games)} (PPO) in two fleets: "
        "faulted and baseline; shipped defaults but for the state dir, port and tier table",
        "faults: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in KINDS) + f"; API write bursts {len(report['bursts'])}",
        "",
        "| t (s) | fault | detail | recovered after (s) | result |",
        "|---:|---|---|---:|---|",
    ]
    for done in report["faults"]:
        f = done.fault
        lines.append(f"| {f.at_s:.0f} | {f.kind} | {done.detail} | {f.end_s - f.at_s:.0f} | {'; '.join(done.problems) or 'ok'} |")
    lines += ["", "checks:", *check_lines(report["checks"])]
    ok = all(c.ok for c in report["checks"])
    lines.append(f"\nresult: {'all checks PASS' if ok else 'some check FAILED'}")
    return "\n".join(lines)


def draw(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = [name for name, _ in report["options"].games]
    fig, axes = plt.subplots(1, len(games), figsize=(5 * len(games), 3.6), dpi=100, squeeze=False)
    for ax, game in zip(axes[0], games, strict=True):
        for label, record, style in (("baseline", report["baseline"], "--"), ("faulted", report["faulted"], "-")):
            curve = record.returns.get(game, [])
            ax.plot([s for s, _ in curve], [v for _, v in curve], style, label=label)
        steps = dict(report["faulted"].steps.get(game, []))
        for done in report["faults"]:
            if done.fault.hits(game) or done.fault.game is None:
                near = [v for t, v in steps.items() if t <= done.fault.at_s]
                if near:
                    ax.axvline(near[-1], color="red", alpha=0.25, linewidth=0.8)
        ax.set_title(f"{game}: mean return (last 100) vs env steps", fontsize=9)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"fleetd soak, seed {report['seed']}, {report['duration_s'] / 60:.0f} min; red: faults", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
