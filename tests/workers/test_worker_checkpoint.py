"""Checkpoint folders: atomic write, manifest verification, listing and pruning (stdlib only)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetd.supervision.index import scan_checkpoints
from workers import checkpoint


def _payload(size: int = 64):
    def populate(folder: Path) -> None:
        (folder / "model.zip").write_bytes(bytes(range(256)) * (size // 256 + 1))
        (folder / "state.json").write_text(json.dumps({"size": size}))
    return populate


def _write(directory: Path, steps: int) -> Path:
    return checkpoint.write_checkpoint(directory, steps, steps // 10, _payload(300 + steps))


def test_write_produces_verified_folder_with_manifest(tmp_path):
    path = _write(tmp_path, 128)
    assert path.name == "ckpt-000000000128"
    assert checkpoint.verify(path) == (True, "ok")
    manifest = checkpoint.read_manifest(path)
    assert set(manifest.files) == {"model.zip", "state.json"}
    assert manifest.steps == 128 and manifest.episodes == 12
    summary = checkpoint.summarize(path)
    assert summary.size_bytes == sum(p.stat().st_size for p in path.iterdir() if p.name != "manifest.json")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_list_is_newest_first_and_ignores_other_entries(tmp_path):
    for steps in (5, 300, 42):
        _write(tmp_path, steps)
    (tmp_path / ".tmp-ckpt-000000000999-1").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    assert [c.steps for c in checkpoint.list_checkpoints(tmp_path)] == [300, 42, 5]
    assert checkpoint.list_checkpoints(tmp_path / "absent") == []


def test_truncated_file_fails_verification(tmp_path):
    path = _write(tmp_path, 10)
    data = (path / "model.zip").read_bytes()
    (path / "model.zip").write_bytes(data[: len(data) // 2])
    ok, reason = checkpoint.verify(path)
    assert not ok and "truncated" in reason and "model.zip" in reason


def test_wrong_hash_fails_verification(tmp_path):
    path = _write(tmp_path, 10)
    data = bytearray((path / "model.zip").read_bytes())
    data[7] ^= 0xFF
    (path / "model.zip").write_bytes(bytes(data))
    ok, reason = checkpoint.verify(path)
    assert not ok and "sha256" in reason


def test_missing_or_malformed_manifest_fails_verification(tmp_path):
    path = _write(tmp_path, 10)
    (path / "manifest.json").write_text("{")
    assert "unreadable" in checkpoint.verify(path)[1]
    (path / "manifest.json").unlink()
    assert "no manifest" in checkpoint.verify(path)[1]


def test_a_manifest_with_a_number_past_a_floats_range_is_malformed_not_a_crash(tmp_path):
    """float() of a 400-digit created_at raised OverflowError, which no caller of read_manifest
    catches (the supervisor's best_evaluated, the worker's resume walk): one hand-edited or
    damaged manifest took them down instead of being passed over."""
    path = _write(tmp_path, 10)
    data = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**data, "created_at": 10**400}))
    with pytest.raises(checkpoint.CheckpointError, match="malformed"):
        checkpoint.read_manifest(path)
    assert "malformed" in checkpoint.verify(path)[1]


@pytest.mark.parametrize("created_at", ["1e400", "NaN", "1e300", "-1e20", "true"])
def test_a_manifest_whose_created_at_is_no_time_is_malformed_and_the_index_lists_it_unverified(tmp_path, created_at):
    """json reads 1e400 as inf: a created_at of inf, NaN or 1e300 passed as a float, verify()
    said ok, and the daemon's index (datetime.fromtimestamp) raised OverflowError/ValueError at
    every worker exit, uncaught: the supervision loop died, and again at each restart."""
    path = _write(tmp_path, 10)
    text = (path / "manifest.json").read_text()
    data = json.loads(text)
    (path / "manifest.json").write_text(text.replace(json.dumps(data["created_at"]), created_at))
    with pytest.raises(checkpoint.CheckpointError, match="malformed: created_at .* is not a time"):
        checkpoint.read_manifest(path)
    assert not checkpoint.verify(path)[0]
    [record] = scan_checkpoints(tmp_path)
    assert not record.verified and "created_at" in record.problem
    assert checkpoint.prune(tmp_path, checkpoint.Retention(1, 24, 7), now=1e9) == []  # int(inf // 3600) raised


# Counts no int64 holds, as JSON: the manifest's and state.json's checks refuse each.
NOT_INT64 = ["1e300", "1e19", "10000000000000000000", "12.5", "\"12\"", "true"]


@pytest.mark.parametrize("field", ["steps", "episodes", "files['model.zip'].size"])
@pytest.mark.parametrize("value", NOT_INT64)
def test_a_manifest_whose_count_is_no_int64_is_malformed_naming_it(tmp_path, field, value):
    """int() took 1e19 (past SQLite's integer: the index's write failed) and 1e300 (a 301-digit
    count), truncated 12.5 and read "12" and true: each now refused like other bad manifests.
    A file's size is named with its file (a bare "size" did not say which)."""
    path = _write(tmp_path, 10)
    data = json.loads((path / "manifest.json").read_text())
    if field.endswith(".size"):
        data["files"]["model.zip"]["size"] = "@"
    else:
        data[field] = "@"
    (path / "manifest.json").write_text(json.dumps(data).replace('"@"', value))
    with pytest.raises(checkpoint.CheckpointError, match=f"malformed: {re.escape(field)} .* is not an integer in int64"):
        checkpoint.read_manifest(path)
    assert not checkpoint.verify(path)[0]
    [record] = scan_checkpoints(tmp_path)
    assert not record.verified and field in record.problem


def test_failed_populate_leaves_nothing_behind(tmp_path):
    def boom(folder: Path) -> None:
        (folder / "model.zip").write_bytes(b"half")
        raise RuntimeError("disk full")

    try:
        checkpoint.write_checkpoint(tmp_path, 1, 0, boom)
    except RuntimeError:
        pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["swapped", "no-renameat2"])
def test_rewrite_of_same_steps_replaces_the_one_there_sound_or_broken(tmp_path, monkeypatch, exchange):
    # One that verifies may still not load (skipped at resume): the new write takes its place,
    # not discarded while reported written.
    if not exchange:
        monkeypatch.setattr(checkpoint, "_exchange", lambda a, b: False)
    first = checkpoint.write_checkpoint(tmp_path, 64, 6, _payload(100))
    again = checkpoint.write_checkpoint(tmp_path, 64, 7, _payload(5000))
    assert again == first and checkpoint.verify(again)[0]
    assert checkpoint.read_manifest(again).episodes == 7 and json.loads((again / "state.json").read_text()) == {"size": 5000}
    (again / "model.zip").write_bytes(b"x")
    assert checkpoint.verify(checkpoint.write_checkpoint(tmp_path, 64, 8, _payload(100)))[0]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000064"]  # the old ones gone


def test_remove_temporaries(tmp_path):
    (tmp_path / ".tmp-ckpt-000000000001-99").mkdir()
    (tmp_path / ".trash-ckpt-000000000002-99").mkdir()
    _write(tmp_path, 3)
    assert len(checkpoint.remove_temporaries(tmp_path)) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000003"]


def test_prune_keeps_last_k(tmp_path):
    for steps in range(1, 6):
        _write(tmp_path, steps)
    removed = checkpoint.prune(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["ckpt-000000000001", "ckpt-000000000002", "ckpt-000000000003"]
    assert [c.steps for c in checkpoint.list_checkpoints(tmp_path)] == [5, 4]


def test_prune_never_deletes_newest_verified(tmp_path):
    for steps in range(1, 5):
        _write(tmp_path, steps)
    for steps in (3, 4):  # the two newest are corrupt
        (tmp_path / checkpoint.checkpoint_name(steps) / "state.json").write_text("garbage!")
    checkpoint.prune(tmp_path, keep=2)
    assert [c.steps for c in checkpoint.list_checkpoints(tmp_path)] == [4, 3, 2]
    assert checkpoint.newest_verified(tmp_path).steps == 2


# -- evaluation figures and retention ---------------------------------------------------------

HOUR, DAY = checkpoint.HOUR_S, checkpoint.DAY_S
NOW = 1_800_000_000.0 - 1_800_000_000.0 % DAY + 12 * HOUR + 600  # 12:10 UTC on some day


def _dated(tmp_path: Path, steps: int, created_at: float, eval_return: float | None = None) -> Path:
    """A real checkpoint written at a chosen time (the manifest is not part of its hashes)."""
    path = checkpoint.write_checkpoint(tmp_path, steps, 0, _payload(300 + steps), eval_return)
    data = json.loads((path / "manifest.json").read_text())
    data["created_at"] = created_at
    (path / "manifest.json").write_text(json.dumps(data))
    return path


def test_eval_return_goes_in_the_manifest_and_old_manifests_still_load(tmp_path):
    scored = checkpoint.write_checkpoint(tmp_path, 10, 1, _payload(), eval_return=123.5)
    assert checkpoint.read_manifest(scored).eval_return == 123.5
    assert checkpoint.summarize(scored).eval_return == 123.5
    plain = checkpoint.write_checkpoint(tmp_path, 20, 2, _payload())
    assert "eval_return" not in json.loads((plain / "manifest.json").read_text())  # as before
    assert checkpoint.read_manifest(plain).eval_return is None
    for odd in (None, "high", True, float("nan"), 10**400):  # not a finite number: not a figure
        data = json.loads((scored / "manifest.json").read_text())
        data["eval_return"] = odd
        (scored / "manifest.json").write_text(json.dumps(data))  # NaN as JSON's NaN
        assert checkpoint.read_manifest(scored).eval_return is None


def test_best_verified_is_the_highest_figure_that_verifies(tmp_path):
    assert checkpoint.best_verified(tmp_path) is None
    checkpoint.write_checkpoint(tmp_path, 10, 0, _payload(), eval_return=5.0)
    checkpoint.write_checkpoint(tmp_path, 20, 0, _payload(), eval_return=50.0)
    checkpoint.write_checkpoint(tmp_path, 30, 0, _payload(), eval_return=20.0)
    checkpoint.write_checkpoint(tmp_path, 40, 0, _payload())  # newest, never evaluated
    assert checkpoint.best_verified(tmp_path).steps == 20
    (tmp_path / checkpoint.checkpoint_name(20) / "model.zip").write_bytes(b"torn")
    assert checkpoint.best_verified(tmp_path).steps == 30  # the best that verifies
    checkpoint.write_checkpoint(tmp_path, 50, 0, _payload(), eval_return=20.0)
    assert checkpoint.best_verified(tmp_path).steps == 50  # a tie goes to the later one


def test_retained_keeps_newest_n_and_one_per_hour_then_per_day():
    policy = checkpoint.Retention(newest=2, hourly=3, daily=2)
    ages = {  # steps: age in seconds (NOW is 12:10 UTC)
        100: 10,  # 12:09
        90: 20 * 60, 80: 40 * 60, 70: 70 * 60,  # 11:50, 11:30, 11:00: 90 is 11:xx's newest
        60: 100 * 60,  # 10:30: the newest (and only one) of 10:xx
        50: 3 * HOUR + 60,  # 09:09: outside the last 3 hours; today's newest is 100
        40: 13 * HOUR,  # yesterday 23:10: yesterday's newest
        30: 20 * HOUR,  # yesterday 16:10
        20: 40 * HOUR,  # two days ago: outside both windows
    }
    dated = [checkpoint.Dated(steps, NOW - age) for steps, age in ages.items()]
    kept = checkpoint.retained(dated, policy, NOW)
    assert kept == {100: "newest", 90: "newest", 60: "hourly", 40: "daily"}
    assert checkpoint.retained(dated, policy, NOW) == kept  # deterministic
    # an hour later the window moves on: 10:xx leaves it, yesterday's newest stays
    later = checkpoint.retained([d for d in dated if d.steps in kept], policy, NOW + HOUR)
    assert set(later) == {100, 90, 40}


def test_retained_without_dates_or_periods_is_the_newest_n():
    dated = [checkpoint.Dated(s, None) for s in (5, 4, 3, 2, 1)]
    assert set(checkpoint.retained(dated, checkpoint.Retention(2, 24, 7), NOW)) == {5, 4}
    dated = [checkpoint.Dated(s, NOW - s * HOUR) for s in (1, 2, 3)]
    assert set(checkpoint.retained(dated, checkpoint.Retention(1, 0, 0), NOW)) == {3}  # most steps


def test_prune_keeps_newest_best_and_periodic_folders(tmp_path):
    _dated(tmp_path, 10, NOW - 3 * DAY, eval_return=400.0)  # old, but the best
    _dated(tmp_path, 20, NOW - 30 * HOUR, eval_return=100.0)  # yesterday, evaluated lower
    _dated(tmp_path, 25, NOW - 29 * HOUR)  # newer the same day: yesterday's newest
    _dated(tmp_path, 30, NOW - 2 * HOUR - 60)
    _dated(tmp_path, 40, NOW - 2 * HOUR)  # the newest of 10:xx
    _dated(tmp_path, 50, NOW - 60)
    _dated(tmp_path, 60, NOW)
    removed = checkpoint.prune(tmp_path, checkpoint.Retention(newest=2, hourly=3, daily=2), now=NOW)
    assert sorted(p.name for p in removed) == [checkpoint.checkpoint_name(s) for s in (20, 30)]
    assert [c.steps for c in checkpoint.list_checkpoints(tmp_path)] == [60, 50, 40, 25, 10]
    assert checkpoint.best_verified(tmp_path).steps == 10
    # the bare count (the worker's old behaviour, and backup's tests) keeps newest and best
    checkpoint.prune(tmp_path, keep=1)
    assert [c.steps for c in checkpoint.list_checkpoints(tmp_path)] == [60, 10]
