"""The REST API: FastAPI routes over the supervision and store layers."""

from fleetd.api.app import create_app

__all__ = ["create_app"]
