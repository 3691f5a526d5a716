"""`python -m workers.catalog`: print every env id a worker can train, as a JSON list.

Run in a subprocess by the daemon, which never imports envpool itself (it would cost the
long-running daemon over 100 MB of memory for one lookup).
"""

from __future__ import annotations

import json
import sys


def env_ids() -> list[str]:
    import ale_py
    import envpool
    import gymnasium

    gymnasium.register_envs(ale_py)
    return sorted(set(envpool.list_all_envs()) | set(gymnasium.envs.registry))


if __name__ == "__main__":
    json.dump(env_ids(), sys.stdout)
