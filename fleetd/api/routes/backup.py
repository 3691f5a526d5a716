"""Backups: their status, and one now (`fleetd backup now`)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from fleetd.api.context import AppContext, get_context
from fleetd.api.errors import CONFLICT
from fleetd.api.schemas import Out
from fleetd.errors import ErrorCode, FleetdError
from fleetd.operations.backup.job import BackupHeld, status_dict

router = APIRouter(tags=["backup"])


class BackupStatusOut(Out):
    configured: bool
    target: str | None = None
    last_db_at: datetime | None = None
    last_db_bytes: int | None = None
    last_checkpoint: str | None = None
    last_checkpoint_at: datetime | None = None
    checkpoints_copied: int = 0
    last_error: str | None = None
    last_error_at: datetime | None = None
    # Why this state_dir writes nothing to the target (restored from it: `fleetd backup claim`).
    held: str | None = None


class BackupRunOut(Out):
    database_bytes: int | None
    copied: list[str]
    removed: list[str]
    status: BackupStatusOut


@router.get("/backup", response_model=BackupStatusOut)
def read_backup(context: AppContext = Depends(get_context)) -> BackupStatusOut:
    """Where backups go and when the last ones were made (since this daemon started)."""
    return BackupStatusOut(**status_dict(context.backup))


@router.post("/backup", response_model=BackupRunOut, responses=CONFLICT)
async def run_backup(context: AppContext = Depends(get_context)) -> BackupRunOut:
    """Back up now: new verified checkpoints, then an online copy of the database."""
    if context.backup is None:
        raise FleetdError(ErrorCode.CONFLICT, "no [backup] target is configured: set [backup] target "
                          "(FLEETD_BACKUP__TARGET) to a directory or an fsspec URL, and restart")
    try:
        run = await run_in_threadpool(context.backup.now)
    except BackupHeld as exc:
        raise FleetdError(ErrorCode.CONFLICT, f"backup to {context.backup.target.url} not made: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the target's own error, for the operator
        raise FleetdError(ErrorCode.INTERNAL, f"backup to {context.backup.target.url} failed: "
                          f"{type(exc).__name__}: {exc}") from None
    status = await run_in_threadpool(status_dict, context.backup)  # held() may read the target
    return BackupRunOut(database_bytes=run.database_bytes, copied=run.copied, removed=run.removed,
                        status=BackupStatusOut(**status))
