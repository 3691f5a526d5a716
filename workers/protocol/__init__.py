"""The supervisor <-> worker contract (docs/worker-protocol.md), one module per concern.

- `spec`: the typed run spec the supervisor writes and the worker reads (section 1).
- `reports`: progress report types and their datagram codec (section 2).
- `sender`: the worker's fire-and-forget datagram sender (section 2).
- `exit_codes`: what a worker's exit code means (section 4).

Standard library and pydantic only: the daemon imports these without pulling in torch.
"""

PROTOCOL_VERSION = 1
# How long the daemon lets a user module import when it checks a `module:EnvName-vN` env id
# (fleetd/games/catalog.py); the CLI waits longer than that for an answer that includes one.
MODULE_IMPORT_TIMEOUT_S = 60


def is_module_env_id(env_id: str) -> bool:
    """`module:EnvName-vN`: a user's own Gymnasium env, registered by importing `module`
    (Gymnasium's own form). The daemon checks it by a subprocess and the worker makes it through
    Gymnasium, never EnvPool (docs/worker.md#your-own-gymnasium-envs). Standard library only:
    the CLI asks it without pydantic."""
    return ":" in env_id
