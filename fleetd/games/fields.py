"""Which of a game's settings change in place. Standard library only: `fleetd games set --help`
lists them without importing the game spec's pydantic models."""

# What `PATCH /games/{name}` and `fleetd games set` may change (docs/operations.md#changing-a-game).
# env_id and algo never change (workers/protocol/spec.py FRESH_START_FIELDS); desired has its
# own start and stop.
SETTABLE = ("priority", "total_timesteps", "target_episodes", "checkpoint_interval_s", "hyperparams", "health_settings")
