"""`python -m workers.catalog`: print every env id a worker can train, as a JSON list.
`python -m workers.catalog --module-env MODULE:ENV_ID`: import MODULE as a worker's Gymnasium
would, and print what that registered, as a JSON object (see `module_env`).

Run in a subprocess by the daemon, which never imports envpool itself (it would cost the
long-running daemon over 100 MB of memory for one lookup), nor a user's module (its code is
the user's, and it may do anything at import).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from typing import Any


def env_ids() -> list[str]:
    import ale_py
    import envpool
    import gymnasium

    gymnasium.register_envs(ale_py)
    return sorted(set(envpool.list_all_envs()) | set(gymnasium.envs.registry))


def module_env(module_env_id: str) -> dict[str, Any]:
    """Whether `module` of `module:ENV_ID` imports (else the last line of its error), whether
    ENV_ID is then registered, and the ids the import registered."""
    import gymnasium

    module, _, env_id = module_env_id.partition(":")
    before = set(gymnasium.envs.registry)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what it prints must not garble our answer
            importlib.import_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever it raises is the answer
        return {"import_error": traceback.format_exception_only(exc)[-1].strip()}
    registered = sorted(set(gymnasium.envs.registry) - before)
    return {"import_error": None, "found": env_id in gymnasium.envs.registry, "registered": registered}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--module-env"]:
        json.dump(module_env(sys.argv[2]), sys.stdout)
        sys.stdout.flush()
        os._exit(0)  # threads the module may have started must not keep this process alive
    json.dump(env_ids(), sys.stdout)
