"""Backups to `[backup] target` and restores from it (docs/operations.md). Each module imports
only those above it:

- `target.py`: a target, its layout (`fleetd.db`, `backup.json`, `games/*/checkpoints`), reading
  its `backup.json` and fetching a checkpoint back from it; `BackupError`;
- `marks.py`: which state_dir may write to a target: its writer id, the restore mark, the claim;
- `sync.py`: a game's checkpoints kept in step with the target's copies (`sync_game`), also
  cluster storage's;
- `job.py`: the backup job (`Backup`: the database and the checkpoints), its status, `BackupHeld`;
- `restore.py`: `fleetd restore`, onto an empty state_dir.

Nothing is re-exported here: import each name from its module.
"""
