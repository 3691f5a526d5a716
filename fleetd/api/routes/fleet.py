from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from fleetd.api.context import AppContext, get_context
from fleetd.api.errors import BAD_BODY
from fleetd.api.metrics import TelemetryAge
from fleetd.api.routes.boots import expected_out
from fleetd.api.schemas import ExpectedRebootOut, FleetOut, FleetUpdate, SettingsOut, TierOut
from fleetd.config import TIER_NAMES
from fleetd.errors import ErrorCode, FleetdError
from fleetd.governor.ladder import Rung, build_ladder, tier_rung
from fleetd.governor.snapshot import SNAPSHOT_STALE_S, FleetSnapshot
from fleetd.host.telemetry import snapshot_json
from fleetd.store import boots as boot_store
from fleetd.store.events import create_event
from fleetd.store import fleet as fleet_store
from fleetd.store.fleet import update_fleet_requested
from fleetd.supervision.commands import Reconcile

router = APIRouter(tags=["fleet"])


def _snapshot(context: AppContext) -> FleetSnapshot:
    snapshot = context.snapshot
    if snapshot is None:
        raise FleetdError(ErrorCode.BUSY, "the governor has not taken its first step yet; try again in a second")
    return snapshot


def holding_words(context: AppContext) -> list[ExpectedRebootOut]:
    """The expected reboots that hold now: shown beside the governor, whose judgement they change."""
    now = context.clock.now()
    with context.db.transaction() as session:
        words = boot_store.read_expected_reboots(session, now)
    return [expected_out(word, now) for word in words if word.holds(now)]


def fleet_out(context: AppContext, snapshot: FleetSnapshot, telemetry_age: TelemetryAge,
              requested: str | None = None) -> FleetOut:
    """The published snapshot; `requested` is the operator's newer choice, not yet taken up
    (None: the stored one, which a PUT wrote and the governor may not have taken up yet: a loop
    behind or stuck showed the request before as taken up). `telemetry_age`: the app's judge of
    the sample's age, which /metrics shares (a stale sample is no reading: `available` false,
    its age said)."""
    if requested is None:
        with context.db.transaction() as session:
            stored = fleet_store.read_fleet(session)
        requested = stored.requested if stored is not None else None
    latest = context.telemetry.latest if context.telemetry else None
    age_s, stale = telemetry_age.judge(latest)
    governor = snapshot.governor
    requested = requested or governor.requested
    taken_up = requested == governor.requested  # else waiting, pending, ladder: the request before's view
    tiers = {name: TierOut(**tier.model_dump()) for name, tier in context.settings.fleet.tiers.items()}
    scaled = governor.scaled
    # What each worker is told (capped on a CPU: 2 envs per thread, a batch of 64), as every
    # game's `settings` says; the rung's own values until the supervisor has sized a worker.
    worker = snapshot.worker_tier
    return FleetOut(
        mode="auto" if requested == "auto" else "manual",
        requested=requested,
        taken_up=taken_up,
        tier=governor.tier,
        level=governor.level,
        allowed=governor.allowed,
        ceiling=governor.ceiling,
        ceiling_until=governor.ceiling_until,
        admitted=list(governor.admitted),
        pending=list(governor.pending),
        next_scale_up_at=governor.next_scale_up_at,
        waiting_reason=governor.waiting_reason,
        rung=governor.rung,
        rungs=list(governor.rungs),
        last_backoff=governor.last_backoff,
        pressure=list(governor.pressure),
        expected_reboots=holding_words(context),
        settings=SettingsOut(num_envs=worker.num_envs or scaled.num_envs, batch_size=worker.batch_size or scaled.batch_size,
                             reason=scaled.reason_for(worker),
                             sizing=None if scaled.sizing is None else scaled.sizing.json()),
        tiers=tiers,
        telemetry=snapshot_json(latest, age_s, telemetry_age.stale_after_s if stale else None),
        **snapshot_age(context, snapshot),
    )


def snapshot_age(context: AppContext, snapshot: FleetSnapshot) -> dict[str, object]:
    """When the snapshot was published, and whether it is old enough to say the loop is stuck."""
    age_s = snapshot.age_s(context.clock)
    return {"snapshot_at": snapshot.at, "snapshot_age_s": round(age_s, 3), "snapshot_stale": age_s > SNAPSHOT_STALE_S}


@router.get("/fleet", response_model=FleetOut)
def read_fleet(request: Request, context: AppContext = Depends(get_context)) -> FleetOut:
    """Tier, mode, admitted and pending games, the next scale-up and why it waits, telemetry."""
    return fleet_out(context, _snapshot(context), request.app.state.metrics.telemetry_age)


@router.put("/fleet", response_model=FleetOut, status_code=202, responses=BAD_BODY)
def update_fleet(body: FleetUpdate, request: Request, context: AppContext = Depends(get_context)) -> FleetOut:
    """Choose a tier (manual) or auto; the governor takes it up within seconds."""
    snapshot = _snapshot(context)
    if body.tier is None and body.mode is None:
        # `{}`: nothing to change, the fleet as it is
        return fleet_out(context, snapshot, request.app.state.metrics.telemetry_age)
    now = context.clock.now()
    ladder = build_ladder(context.settings.fleet.tiers)
    with context.db.transaction() as session:
        record = fleet_store.read_fleet(session)  # the operator's latest request, perhaps not yet taken up
        requested = requested_of(body, record.requested if record else snapshot.governor.requested, snapshot.governor.level - 1, ladder)
        update_fleet_requested(session, requested, now)
        create_event(session, now, "fleet_request", f"tier {requested} requested")
    if context.supervisor is not None:
        context.supervisor.submit(Reconcile())
    return fleet_out(context, snapshot, request.app.state.metrics.telemetry_age, requested)


def requested_of(body: FleetUpdate, requested: str, index: int, ladder: tuple[Rung, ...]) -> str:
    """The request a body makes, given the one standing (`requested`) and the rung the fleet is
    at (`index`). `{"mode": "manual"}` alone: a manual request stays (the fleet may still be
    climbing to it: its rung's tier is no request); from auto, the lowest tier whose rung is at
    or above the fleet's, so that no game is shed (auto at 4x48, named light, becomes medium)."""
    if body.mode == "auto":
        if body.tier is not None:
            raise FleetdError(
                ErrorCode.VALIDATION,
                "body.tier: auto mode chooses the tier itself; give either a tier or mode auto",
                {"errors": [{"field": "body.tier", "reason": "not with mode auto"}]},
            )
        return "auto"
    if body.tier is not None:
        return body.tier
    if requested != "auto":
        return requested
    return next((tier for tier in TIER_NAMES if tier_rung(ladder, tier) >= index), TIER_NAMES[-1])
