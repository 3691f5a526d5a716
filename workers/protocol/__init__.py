"""The supervisor <-> worker contract (docs/worker-protocol.md), one module per concern.

- `spec`: the typed run spec the supervisor writes and the worker reads (section 1).
- `reports`: progress report types and their datagram codec (section 2).
- `sender`: the worker's fire-and-forget datagram sender (section 2).
- `exit_codes`: what a worker's exit code means (section 4).

Standard library and pydantic only: the daemon imports these without pulling in torch.
"""

PROTOCOL_VERSION = 1
