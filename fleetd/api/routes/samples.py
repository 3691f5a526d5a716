from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from fleetd.api.context import AppContext, get_context
from fleetd.api.schemas import IsoDateTime, SampleOut, SampleSeries
from fleetd.games.spec import AS_WRITTEN
from fleetd.games.slug import GAME_NAME_PATTERN
from fleetd.store.samples import read_samples

router = APIRouter(tags=["samples"])


@router.get("/samples", response_model=SampleSeries)
def list_samples(
    metric: str = Query(max_length=48, pattern=r"^[a-z0-9_]+$", description="e.g. steps, episodes, mean_reward_100, gpu_utilization_pct"),
    game: str | None = Query(None, pattern=GAME_NAME_PATTERN, description="a game's samples"),
    gpu: Annotated[int | None, Query(ge=0, le=63, description="a GPU's samples"), AS_WRITTEN] = None,
    since: IsoDateTime | None = Query(None, description="ISO 8601, without an offset UTC; "
                                                        "default: the last 24 hours"),
    limit: Annotated[int, Query(ge=1, le=20000, description="the newest this many points"), AS_WRITTEN] = 2000,
    context: AppContext = Depends(get_context),
) -> SampleSeries:
    """One metric over time, oldest first: a game's (game=), a GPU's (gpu=), else the host's."""
    since = since or context.clock.now() - timedelta(days=1)
    with context.db.transaction() as session:
        records = read_samples(session, game, gpu, metric, since, limit)
    points = [SampleOut(at=r.at, value=r.value) for r in records]
    return SampleSeries(game=game, gpu=gpu, metric=metric, points=points)
