"""The fleetd training worker: one process trains one game (docs/worker.md).

`workers.protocol` and `workers.checkpoint` are standard-library only; the daemon imports them.
"""
