from fastapi import APIRouter

from fleetd import __version__
from fleetd.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """Open (no token): answers while the daemon serves."""
    return Health(status="ok", version=__version__)
