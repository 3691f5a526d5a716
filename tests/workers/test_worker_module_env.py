"""A user's own Gymnasium env, named `module:EnvName-vN`: a real worker trains it.

The worker runs with an `envpool` on its path that fails when imported: an env id of the
module form is made by Gymnasium (which imports the module), and EnvPool is never tried.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.workers.conftest import spec_dict
from workers import checkpoint
from workers.protocol.exit_codes import ExitCode

REPO = Path(__file__).resolve().parents[2]
CORRIDOR = "tests.e2e_workers.corridor_env:Corridor-v0"
NO_ENVPOOL = 'raise RuntimeError("EnvPool was tried for a module:EnvName-vN env id")\n'


def test_a_worker_trains_a_module_env_with_gymnasium_and_writes_a_verified_checkpoint(
        make_spec, write_spec, tmp_path):
    shim = tmp_path / "shim" / "envpool"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(NO_ENVPOOL)
    hyperparams = spec_dict(tmp_path)["hyperparams"] | {"eval_episodes": 2, "eval_interval_steps": 256}
    spec = make_spec(game="corridor", env_id=CORRIDOR, total_timesteps=256, hyperparams=hyperparams)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim.parent), str(REPO)])}
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "workers", "--spec", str(write_spec(spec.to_dict()))],
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        code = proc.wait(timeout=120)  # a bound, not a speed claim: about 10 s here
    finally:
        if proc.poll() is None:
            proc.kill()  # only the pid this test started
            proc.wait(timeout=10)
    assert code == ExitCode.COMPLETED, log_path.read_text()
    final = checkpoint.list_checkpoints(spec.checkpoint_dir)[0]
    assert checkpoint.verify(final.path) == (True, "ok")
    assert final.steps >= 256
    assert checkpoint.read_manifest(final.path).eval_return is not None  # the evaluation env is one too
