"""The fleetd training worker: one process trains one game (docs/worker.md).

`workers.protocol` (standard library and pydantic) and `workers.checkpoint` (standard library)
import no torch; the daemon imports them.
"""
