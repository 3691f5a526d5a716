from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from fleetd.api.context import AppContext, get_context
from fleetd.api.schemas import IsoDateTime, MAX_ID, EventList, EventOut
from fleetd.games.spec import AS_WRITTEN
from fleetd.store.events import EventFilter, read_events

router = APIRouter(tags=["events"])


@router.get("/events", response_model=EventList)
def list_events(
    limit: Annotated[int, Query(ge=1, le=1000), AS_WRITTEN] = 100,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="only events older than this id (paging)"),
                      AS_WRITTEN] = None,
    kind: str | None = Query(None, max_length=32),
    game: str | None = Query(None, max_length=64),
    since: IsoDateTime | None = Query(None, description="only events at or after this time (ISO 8601; "
                                                        "without an offset, UTC)"),
    context: AppContext = Depends(get_context),
) -> EventList:
    """The event log, newest first."""
    # One more than asked: a page that ends the log says so (no next_before) even when it is full.
    where = EventFilter(kind=kind, game=game, since=since, before_id=before, limit=limit + 1)
    with context.db.transaction() as session:
        found = read_events(session, where)
    events = found[:limit]
    items = [EventOut(**vars(event)) for event in events]
    next_before = events[-1].id if len(found) > limit else None
    return EventList(items=items, next_before=next_before)
