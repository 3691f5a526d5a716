"""fleetd: a supervisor daemon for multi-game reinforcement learning training fleets."""

__version__ = "0.1.0"
