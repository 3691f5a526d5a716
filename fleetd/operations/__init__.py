"""What an operator asks of a running fleet beyond supervision (docs/operations.md).

- `alerts.py`: alerts on a reboot, a FATAL game, a back-off, a completed game;
- `backup/`: backups to `[backup] target` and restores from it;
- `model_io.py`: plain SB3 models imported as games and checkpoints exported;
- `run_logs.py`: a run's log file, its last lines and what follows (`fleetd logs`).
"""
