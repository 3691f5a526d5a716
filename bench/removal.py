"""How long removing a game with N samples takes, and the longest the write lock is held meanwhile.

A game sampled for samples_days holds hundreds of thousands of samples. Its removal
(`fleetd.games.lifecycle.remove_game`, as `fleetd games rm` runs it) deletes them DELETE_BATCH
a transaction, then the game's row: each of those write transactions holds SQLite's write lock,
and the supervisor's writes wait for it at most busy_timeout_ms (5 s by default) before they
fail. This builds a fresh fleetd database (the real schema, on a real file), gives one stopped
game `--samples` samples (spread over four metrics, one a second, as the sampler writes them),
removes it through the real store, and reports the whole removal's time and each write
transaction's hold: timed from just before its BEGIN IMMEDIATE to its commit, so a hold includes
any wait for the lock (the bench runs no other writer).

    PYTHONPATH=. python bench/removal.py                    # 600,000 samples
    PYTHONPATH=. python bench/removal.py --samples 2000000
    PYTHONPATH=. python bench/removal.py --short            # a few seconds; tests/test_bench_removal.py

Figures: docs/benchmarks.md#game-removal.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetd.clock import SystemClock  # noqa: E402 - after the path set-up above
from fleetd.games.lifecycle import remove_game  # noqa: E402
from fleetd.states import Desired  # noqa: E402
from fleetd.store import games as game_store  # noqa: E402
from fleetd.store.engine import DELETE_BATCH, Database  # noqa: E402
from fleetd.store.models import Sample  # noqa: E402
from fleetd.store.records import GameDraft  # noqa: E402
from fleetd.store.schema import ensure_schema  # noqa: E402

DEFAULT_SAMPLES = 600_000
SHORT_SAMPLES = 2 * DELETE_BATCH + 5_000  # three batches: two full, one not
METRICS = ("steps_per_s", "episode_return", "gpu_mib", "rss_mib")
INSERT_CHUNK = 50_000


class TimedDatabase(Database):
    """The store's Database, timing each write transaction (immediate, as every removal
    transaction is: it holds the write lock from its BEGIN IMMEDIATE to its commit). The time
    starts before the BEGIN, so it includes any wait for the lock."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.holds: list[float] = []

    @contextmanager
    def transaction(self, immediate: bool = False) -> Iterator[Session]:
        started = time.perf_counter()
        try:
            with super().transaction(immediate) as session:
                yield session
        finally:
            if immediate:
                self.holds.append(time.perf_counter() - started)


def fill(db: Database, game_id: int, samples: int) -> None:
    start = SystemClock().now() - timedelta(seconds=samples)
    written = 0
    while written < samples:
        rows = [{"at": start + timedelta(seconds=(written + i) // len(METRICS)), "game_id": game_id,
                 "gpu_index": None, "metric": METRICS[(written + i) % len(METRICS)], "value": float(i)}
                for i in range(min(INSERT_CHUNK, samples - written))]
        with db.transaction() as session:
            session.connection().execute(insert(Sample.__table__), rows)
        written += len(rows)


def measure(samples: int, root: Path) -> dict:
    db_path = root / "fleetd.db"
    ensure_schema(db_path, "fleetd db upgrade")
    clock = SystemClock()
    db = TimedDatabase.open(db_path)
    try:
        with db.transaction() as session:
            game = game_store.create_game(session, GameDraft("gone", "CartPole-v1", "ppo", Desired.STOPPED, 0),
                                          clock.now())
        filled = time.perf_counter()
        fill(db, game.id, samples)
        fill_s = time.perf_counter() - filled
        db.holds.clear()
        started = time.perf_counter()
        remove_game(db, clock, "gone", root / "games" / "gone", purge=False)
        removal_s = time.perf_counter() - started
        with db.transaction() as session:
            left = session.scalar(select(func.count()).select_from(Sample.__table__))
            assert not game_store.game_exists(session, "gone") and left == 0, left
        holds = db.holds
    finally:
        db.close()
    return {"samples": samples, "delete_batch": DELETE_BATCH, "fill_s": round(fill_s, 2),
            "removal_s": round(removal_s, 3), "write_transactions": len(holds),
            "longest_hold_s": round(max(holds), 3), "mean_hold_s": round(sum(holds) / len(holds), 3),
            "holds_s": [round(hold, 3) for hold in holds]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="the game's samples (default 600,000)")
    parser.add_argument("--short", action="store_true", help=f"{SHORT_SAMPLES:,} samples: a few seconds")
    parser.add_argument("--json", type=Path, help="write the result here too")
    args = parser.parse_args(argv)
    samples = SHORT_SAMPLES if args.short else args.samples
    if samples < 1:
        parser.error("--samples must be at least 1")
    with tempfile.TemporaryDirectory(prefix="fleetd-removal-") as root:
        result = measure(samples, Path(root))
    result["machine"] = f"{platform.machine()}, Python {platform.python_version()}"
    print(f"removed a game with {result['samples']:,} samples in {result['removal_s']:.2f} s "
          f"({result['write_transactions']} write transactions, DELETE_BATCH {DELETE_BATCH:,}); "
          f"longest write-lock hold {result['longest_hold_s']:.3f} s, mean {result['mean_hold_s']:.3f} s "
          f"(filling took {result['fill_s']:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
