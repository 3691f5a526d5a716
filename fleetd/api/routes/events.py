from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from fleetd.api.context import AppContext, get_context
from fleetd.api.schemas import IsoDateTime, MAX_ID, EventList, EventOut
from fleetd.games.spec import AS_WRITTEN
from fleetd.store.events import EventFilter, read_current_games_start, read_events, read_removal_ids
from fleetd.store.records import EventRecord

router = APIRouter(tags=["events"])


@router.get("/events", response_model=EventList)
def list_events(
    limit: Annotated[int, Query(ge=1, le=1000), AS_WRITTEN] = 100,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="only events older than this id (paging)"),
                      AS_WRITTEN] = None,
    kind: str | None = Query(None, max_length=32),
    game: str | None = Query(None, max_length=64, description="only events of the game of this name now (a name "
                                                              "no game has now: every removed game's of that name)"),
    earlier: bool = Query(False, description="with game: also the events of earlier games of that name, removed "
                                             "since (each with removed_game true)"),
    since: IsoDateTime | None = Query(None, description="only events at or after this time (ISO 8601; "
                                                        "without an offset, UTC)"),
    context: AppContext = Depends(get_context),
) -> EventList:
    """The event log, newest first."""
    with context.db.transaction() as session:
        # One more than asked: a page that ends the log says so (no next_before) even when it is full.
        where = EventFilter(kind=kind, game=game, since=since, before_id=before, limit=limit + 1,
                            after_id=None if earlier or game is None else read_current_games_start(session, game))
        found = read_events(session, where)
        events = found[:limit]
        removals = read_removal_ids(session, {event.game for event in events if event.game is not None})
    items = [EventOut(**vars(event), removed_game=_of_removed_game(event, removals)) for event in events]
    next_before = events[-1].id if len(found) > limit else None
    return EventList(items=items, next_before=next_before)


def _of_removed_game(event: EventRecord, removals: dict[str, int]) -> bool:
    return event.game is not None and event.id <= removals.get(event.game, 0)
