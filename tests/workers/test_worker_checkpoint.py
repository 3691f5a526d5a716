"""Checkpoint folders: atomic write, manifest verification, listing and pruning (stdlib only)."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_failed_populate_leaves_nothing_behind(tmp_path):
    def boom(folder: Path) -> None:
        (folder / "model.zip").write_bytes(b"half")
        raise RuntimeError("disk full")

    try:
        checkpoint.write_checkpoint(tmp_path, 1, 0, boom)
    except RuntimeError:
        pass
    assert list(tmp_path.iterdir()) == []


def test_rewrite_of_same_steps_keeps_sound_one_and_replaces_broken(tmp_path):
    first = _write(tmp_path, 64)
    before = (first / "manifest.json").read_text()
    assert _write(tmp_path, 64) == first and (first / "manifest.json").read_text() == before
    (first / "model.zip").write_bytes(b"x")
    again = _write(tmp_path, 64)
    assert checkpoint.verify(again)[0]


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
