"""[cluster] settings, and the local path never importing Ray (an optional extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetd.config import ConfigError, load_settings


def test_the_local_path_never_imports_ray(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import fleetd.daemon, fleetd.supervision.launcher, fleetd.supervision.reactor, fleetd.api, fleetd.cli.main\n"
        "from fleetd.config import load_settings\n"
        f"s = load_settings(state_dir={str(tmp_path)!r})\n"
        "assert s.cluster.backend == 'local'\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_ray_backend_puts_game_dirs_under_the_shared_storage(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path / "state", cluster={"backend": "ray", "storage": "/mnt/fleet"})
    assert settings.game_dir("pong") == Path("/mnt/fleet/games/pong")
    assert load_settings(state_dir=tmp_path / "state").game_dir("pong") == tmp_path / "state" / "games" / "pong"


def test_a_url_storage_keeps_game_dirs_on_the_head(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    settings = load_settings(state_dir=tmp_path / "state", cluster={"backend": "ray", "storage": url})
    assert settings.cluster.storage_url == url
    assert settings.game_dir("pong") == tmp_path / "state" / "games" / "pong"
    mounted = load_settings(state_dir=tmp_path / "state", cluster={"backend": "ray", "storage": "/mnt/fleet"})
    assert mounted.cluster.storage_url is None


def test_a_url_whose_package_is_missing_names_the_key_the_protocol_and_the_package(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("s3fs") is not None:
        pytest.skip("s3fs is installed here")
    with pytest.raises(ConfigError) as caught:
        load_settings(state_dir=tmp_path, cluster={"backend": "ray", "storage": "s3://bucket/fleet"})
    message = str(caught.value)
    assert "cluster.storage" in message and "s3://" in message and "s3fs" in message, message


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"backend": "ray"}, "backend = 'ray' needs storage: a path every node mounts"),
        ({"backend": "ray", "storage": "nope://bucket/fleet"}, "fsspec cannot open it: Protocol not known: nope"),
        ({"backend": "ray", "storage": "fleet"}, "must be an absolute path that every node mounts"),
        ({"backend": "ray", "storage": "file:///f", "cache_dir": "cache"}, "cluster.cache_dir"),
        ({"backend": "ray", "storage": "/mnt/f", "address": "http://head"}, "cluster.address = 'http://head'"),
        ({"backend": "kubernetes"}, "cluster.backend = 'kubernetes'"),
    ],
)
def test_bad_cluster_settings_name_the_key_and_the_reason(tmp_path: Path, cluster: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(state_dir=tmp_path, cluster=cluster)
    assert message in str(caught.value)


def test_good_addresses(tmp_path: Path) -> None:
    for address in ("auto", "ray://head.lan:10001", "10.0.0.1:6379"):
        assert load_settings(state_dir=tmp_path, cluster={"address": address}).cluster.address == address


def test_device_cuda_on_ray_needs_a_gpu_share_per_game(tmp_path: Path) -> None:
    """On Ray the GPUs are Ray's to place: an actor asking for none is given none and sees none
    (fleetd/cluster/actors.py), so device 'cuda' with num_gpus_per_game 0 could never train."""
    ray = {"backend": "ray", "storage": "/mnt/fleet"}
    with pytest.raises(ConfigError) as caught:
        load_settings(state_dir=tmp_path, cluster=ray, worker={"device": "cuda"})
    assert "cluster.num_gpus_per_game = 0.0: worker.device = 'cuda' on backend = 'ray' needs a GPU share" in str(caught.value)
    assert load_settings(state_dir=tmp_path, cluster=ray | {"num_gpus_per_game": 0.25}, worker={"device": "cuda"})
    assert load_settings(state_dir=tmp_path, cluster=ray, worker={"device": "auto"})  # a CPU cluster: trains on CPU
    assert load_settings(state_dir=tmp_path, worker={"device": "cuda"})  # local: fleetd places GPUs itself
