from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from fleetd.api.metrics import Exposition

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(request: Request) -> Response:
    """Prometheus text format (docs/metrics.md). Open like /healthz: game names and figures, no secrets."""
    exposition: Exposition = request.app.state.metrics
    return Response(exposition.render(), media_type=CONTENT_TYPE_LATEST)
