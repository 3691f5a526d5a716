"""Models in and out, end to end: a model trained with plain stable-baselines3 is imported into
a real daemon and resumes at its step count; the game is exported and a fresh interpreter
without fleetd on its path loads the zip with plain SB3 and plays an episode."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.daemon_harness import (
    SUPERVISION,
    WORKER_START_S,
    Daemon,
    DaemonConfig,
    fleetd_cli,
    kill_leftover_workers,
    short_tmp_dir,
    start_daemon,
)

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
SMALL = "--hp num_envs=2".split()


@pytest.fixture
def config():
    root = short_tmp_dir()
    cfg = DaemonConfig(root, extra=SUPERVISION)
    cfg.write()
    cfg.set_boot_id("boot-a")
    yield cfg
    kill_leftover_workers(cfg)
    shutil.rmtree(root, ignore_errors=True)




@pytest.fixture(scope="module")
def plain_model(tmp_path_factory) -> tuple[Path, int]:
    """A tiny PPO trained on CartPole by plain SB3 (no fleetd class, env or callback)."""
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=1,
                policy_kwargs={"net_arch": [16]}, seed=1)
    model.learn(256)
    path = tmp_path_factory.mktemp("plain") / "cartpole_ppo.zip"
    model.save(path)
    return path, model.num_timesteps


def upload(daemon: Daemon, name: str, body: bytes, **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {daemon.config.token()}", "Content-Type": "application/zip"}
    return httpx.post(f"{daemon.config.url}/api/v1/games/{name}/import", params=params, content=body,
                      headers=headers, timeout=300)


def test_imported_model_resumes_at_its_step_count_and_exports_for_plain_sb3(config, daemons, plain_model, tmp_path):
    model_zip, steps = plain_model
    daemon = start_daemon(config, daemons)
    done = fleetd_cli(config, "games", "import", "cart", "CartPole-v1", "--from", str(model_zip), *SMALL, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("fleetd: importing cart: uploading "), done.stderr
    game = daemon.wait_for_game("cart", lambda g: g["state"] == "running" and g["steps"] > steps,
                                WORKER_START_S, f"training past {steps} steps")
    assert game["algo"] == "ppo"  # detected from the zip
    assert daemon.runs("cart")[-1]["resumed_from_steps"] == steps
    kinds = {e["kind"]: e for e in daemon.get("/api/v1/events?game=cart").json()["items"]}
    assert kinds["game_imported"]["details"]["steps"] == steps

    out = tmp_path / "export"
    done = fleetd_cli(config, "games", "export", "cart", "--latest", "-o", str(out), timeout=300)
    assert done.returncode == 0, done.stderr
    # Issue 25 item 4: what it is doing, on stderr; stdout is the result alone.
    assert done.stderr.startswith("fleetd: exporting cart: the daemon packs its latest checkpoint"), done.stderr
    assert f"fleetd: unpacking into {out}" in done.stderr and done.stdout.startswith("exported cart ("), done.stdout
    meta = json.loads((out / "fleetd-export.json").read_text())
    assert meta["env_id"] == "CartPole-v1" and meta["algo"] == "ppo" and meta["steps"] >= steps
    played = play_without_fleetd(out)
    assert played["num_timesteps"] == meta["steps"] and played["episode_steps"] >= 1


PLAY = """
import importlib.util, json, sys
# The venv's editable install adds the checkout by a .pth file: keep the standard library and
# site-packages only (the venv's site-packages holds no fleetd code, only its packaged data).
sys.path[:] = [p for p in sys.path if p.startswith(sys.base_prefix) or p.endswith("site-packages")]
for module in ("workers", "fleetd.config", "fleetd.operations"):
    assert importlib.util.find_spec(module) is None, (module, sys.path)
meta = json.load(open("fleetd-export.json"))
from stable_baselines3 import PPO
import envpool
model = PPO.load("model.zip", device="cpu")
env = envpool.make_gymnasium(meta["env_id"], **meta["env_kwargs"])
obs, _ = env.reset()
length = 0
while True:
    action, _ = model.predict(obs, deterministic=True)
    obs, reward, terminated, truncated, _ = env.step(action)
    length += 1
    if terminated[0] or truncated[0]:
        break
print(json.dumps({"num_timesteps": model.num_timesteps, "episode_steps": length}))
"""


def play_without_fleetd(folder: Path) -> dict:
    """`python -I` (no PYTHONPATH, no script folder, no user site) and a sys.path of the
    standard library and site-packages: fleetd and workers cannot be imported."""
    done = subprocess.run([sys.executable, "-I", "-c", PLAY], cwd=folder, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_refusals_name_what_does_not_fit(config, daemons, plain_model):
    model_zip, _ = plain_model
    daemon = start_daemon(config, daemons)
    body = model_zip.read_bytes()

    wrong_env = upload(daemon, "acro", body, env_id="Acrobot-v1")
    assert wrong_env.status_code == 422, wrong_env.text
    assert "observation space does not match" in wrong_env.json()["error"]["message"]
    assert "Acrobot-v1" in wrong_env.json()["error"]["message"]

    wrong_algo = upload(daemon, "cart", body, env_id="CartPole-v1", algo="dqn")
    assert wrong_algo.status_code == 422 and "holds a PPO model" in wrong_algo.json()["error"]["message"]

    not_zip = upload(daemon, "cart", b"not a zip", env_id="CartPole-v1")
    assert not_zip.status_code == 422 and "not a zip" in not_zip.json()["error"]["message"]

    bundle = model_zip.parent / "with_buffer.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.write(model_zip, "model.zip")
        archive.writestr("replay_buffer.pkl", b"x")
    on_policy = upload(daemon, "cart", bundle.read_bytes(), env_id="CartPole-v1")
    assert on_policy.status_code == 422 and "on-policy" in on_policy.json()["error"]["message"]

    done = fleetd_cli(config, "games", "import", "cart", "NoSuchEnv-v0", "--from", str(model_zip))
    assert done.returncode != 0 and "NoSuchEnv-v0" in done.stderr
    assert daemon.get("/api/v1/games").json()["items"] == []  # nothing half-added
    assert not list((config.state_dir / "games").glob("*/checkpoints/ckpt-*"))

    ok = upload(daemon, "cart", body, env_id="CartPole-v1", desired="stopped")
    assert ok.status_code == 201, ok.text
    again = upload(daemon, "cart", body, env_id="CartPole-v1", desired="stopped")
    assert again.status_code == 409 and "already exists" in again.json()["error"]["message"]
    best = daemon.get("/api/v1/games/cart/export?which=best")
    assert best.status_code == 409 and "no checkpoint of cart has an evaluation" in best.json()["error"]["message"]


def test_a_start_removes_the_transfers_and_backup_copies_an_earlier_daemons_end_cut_short(config, daemons):
    # A daemon killed during an import, an export or a backup (SIGKILL, OOM, a power cut) left
    # its upload (up to [api] max_upload_bytes), its export folder or its database copy behind,
    # and no later start removed them.
    transfers, backups = config.state_dir / "transfers", config.state_dir / "backups"
    (transfers / "export-x4spfqfc" / "bundle").mkdir(parents=True)
    (transfers / "export-x4spfqfc" / "bundle" / "model.zip").write_bytes(b"x" * 1000)
    (transfers / ".upload-abc123.zip").write_bytes(b"x" * 1000)
    (transfers / "import-def456" / "upload").mkdir(parents=True)
    (backups / "db-ghi789").mkdir(parents=True)
    (backups / "db-ghi789" / "fleetd.db").write_bytes(b"x" * 1000)
    cut_short = ".partial-fleetd-schema-0009-20260101T000100Z.db"  # `fleetd db upgrade` killed copying aside
    for name in (cut_short, cut_short + "-journal"):
        (backups / name).write_bytes(b"x" * 1000)
    upgrade_copy = backups / "fleetd-schema-0009-20260101T000000Z.db"  # `fleetd db upgrade`'s: kept
    upgrade_copy.write_bytes(b"a database")

    start_daemon(config, daemons)

    assert list(transfers.iterdir()) == []
    assert list(backups.iterdir()) == [upgrade_copy]
