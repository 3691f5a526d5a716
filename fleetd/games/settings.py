"""Changing a game's settings (`PATCH /games/{name}`, `fleetd games set`, `fleetd apply`):
what changed, whether it may, and the record of it. Applied at the game's next start, or now by
a restart (asked for, or new sizes: `LiveWorkers`); the worker applies changed hyperparameters
to the model it resumes (workers/changes.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from fleetd.clock import Clock
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.catalog import CheckedOnce, EnvCheck
from fleetd.games.fields import EXPECT_FIELD, SettingChange, key_changes, overrides_tag, when_taken
from fleetd.games.lifecycle import check_draft, refuse_field
from fleetd.games.spec import SETTABLE, GameSpec
from fleetd.store import games as game_store
from fleetd.store import runs as run_store
from fleetd.store.engine import Database
from fleetd.store.events import create_event
from fleetd.store.records import GameDraft, GameRecord
from workers.protocol.spec import FRESH_START_FIELDS, change_refusal

if TYPE_CHECKING:
    from fleetd.store.engine import Session  # the store's; only the store imports SQLAlchemy

DICT_FIELDS = ("hyperparams", "health_settings")  # changed key by key, shown as `field.KEY`


class LiveWorkers(Protocol):
    """What the supervisor last showed of the games' live workers: the settings a game's worker
    was not started with, and why it restarts now (fleetd/supervision/pending.py `LiveRuns`)."""

    def pending(self, game: GameRecord) -> list[SettingChange]: ...

    def restart_reason(self, game: GameRecord, asked: bool) -> str | None: ...


class NoWorkers:
    """No supervisor in this process: no worker to restart, nothing pending."""

    def pending(self, game: GameRecord) -> list[SettingChange]:
        return []

    def restart_reason(self, game: GameRecord, asked: bool) -> str | None:
        return None


NO_WORKERS = NoWorkers()


@dataclass(frozen=True)
class SettingsUpdate:
    """What `PATCH /games/{name}` did: the game as stored, what changed, what its live worker
    was not started with (after the change), and why it restarts now (None: it does not)."""

    game: GameRecord
    changes: list[SettingChange]
    pending: list[SettingChange]
    restart: str | None


def with_defaults(values: Mapping[str, Any]) -> dict[str, Any]:
    """null (None) sets a field back to its default: no goal, [worker]'s interval, no overrides."""
    return {key: GameSpec.model_fields[key].get_default(call_default_factory=True) if value is None else value
            for key, value in values.items()}


def setting_changes(game: GameRecord, wanted: Mapping[str, Any]) -> list[SettingChange]:
    """The fields of `wanted` (SETTABLE keys, defaults filled in) whose value differs from the game's."""
    changes = []
    for key in (k for k in SETTABLE if k in wanted):
        if key in DICT_FIELDS:
            changes += key_changes(key, getattr(game, key), wanted[key])
        elif getattr(game, key) != wanted[key]:
            changes.append(SettingChange(key, getattr(game, key), wanted[key]))
    return changes


def with_settings(game: GameRecord, wanted: Mapping[str, Any]) -> GameRecord:
    """The game as it is once `wanted` is stored: what its next start gets."""
    return replace(game, **{key: wanted[key] for key in SETTABLE if key in wanted})


def trained(game: GameRecord) -> bool:
    """It has steps or a checkpoint: its next run resumes, so what the checkpoint fixes stays."""
    return game.steps > 0 or game.last_checkpoint is not None


def check_changes(game: GameRecord, wanted: Mapping[str, Any], changes: list[SettingChange],
                  catalog: EnvCheck, prefix: str = "", session: Session | None = None) -> None:
    """The game with its new settings is checked as `games add` would check it; then every
    changed hyperparameter must be one this game's algorithm takes, and may change on resume
    (an explicit value its model keeps is not unset: unless its last run, as its spec says, never
    trained with that value, an undo of a `set` no run took). A stored key the algorithm does
    not take (an older fleetd's) refuses only its own change, not another's: the game is not stuck."""
    draft = GameDraft(name=game.name, env_id=game.env_id, algo=game.algo,
                      hyperparams=wanted.get("hyperparams", game.hyperparams),
                      health_settings=wanted.get("health_settings", game.health_settings))
    set_keys = [key for key, change in _hyperparams(changes) if change.new is not None]
    check_draft(draft, catalog, prefix, algo_keys=set_keys)
    for field, why in change_refusals(game, changes, session)[:1]:
        refuse_field(f"{prefix}{field}", why)


def change_refusals(game: GameRecord, changes: list[SettingChange], session: Session | None = None) -> list[tuple[str, str]]:
    """The hyperparameter changes refused for this game, each (field, why): one its algorithm does
    not take, one its checkpoints fix, an explicit value its model keeps removed."""
    refused = []
    for key, change in _hyperparams(changes):
        unset = change.old if change.new is None else None  # an explicit value removed
        if unset is not None and session is not None:
            unset = _trained_value(session, game, key, unset)
        why = change_refusal(key, game.algo, trained(game), unset, removed=change.new is None)
        if why is not None:
            refused.append((change.field, why))
    return refused


def _hyperparams(changes: list[SettingChange]) -> list[tuple[str, SettingChange]]:
    """The hyperparameter changes, each with its key."""
    return [(change.field.removeprefix("hyperparams."), change) for change in changes
            if change.field.startswith("hyperparams.")]


def _trained_value(session: Session, game: GameRecord, key: str, stored: Any) -> Any:
    """The value of hyperparameter `key` its model holds, as its newest run with a readable spec
    was started with it (whatever was set since: `set` 0.001 then unset, over a run at 0.01,
    leaves the model at 0.01); None where that run named none (the model has the default: a set
    no run took is undone). Where no spec says (an imported model, specs pruned), the value
    stored: its model may hold it."""
    for run in run_store.read_runs(session, game.id, game.name, 5):
        if not run.log_path:
            continue
        try:
            spec = json.loads(Path(run.log_path).with_suffix(".spec.json").read_bytes())
        except (OSError, ValueError):
            continue
        overrides = spec.get("hyperparams") if isinstance(spec, dict) else None
        return overrides.get(key) if isinstance(overrides, dict) else stored
    return stored


def check_identity(game: GameRecord, env_id: str, algo: str, prefix: str = "") -> None:
    """env_id and algo name what the checkpoints are of: never changed in place (409: the same
    entry is fine for a game of that name that does not exist yet)."""
    for field, new in (("env_id", env_id), ("algo", algo)):
        old = getattr(game, field)
        if new != old:
            reason = (f"cannot change {old!r} to {new!r} on game {game.name!r}: {FRESH_START_FIELDS[field]}; "
                      "add a game with another name (or remove this one first)")
            raise FleetdError(ErrorCode.CONFLICT, f"{prefix}{field}: {reason}",
                              {"errors": [{"field": f"{prefix}{field}", "reason": reason}]})


def check_algo(game: GameRecord, values: Mapping[str, Any]) -> None:
    """PATCH names the game's algorithm beside hyperparameters (the schema checks their keys as
    that algorithm's); neither it nor env_id is a setting: another one is a conflict, as in a
    fleet file, with the same reason."""
    if "algo" in values or "env_id" in values:
        check_identity(game, values.get("env_id", game.env_id), values.get("algo", game.algo))
    if "hyperparams" in values and "algo" not in values:
        refuse_field("algo", f"required with hyperparams: the game's algorithm ({game.algo!r}), whose keys "
                             f"they must be; send \"algo\": \"{game.algo}\"")


def record_changes(session: Session, clock: Clock, game: GameRecord, wanted: Mapping[str, Any],
                   changes: list[SettingChange], restart: bool) -> GameRecord:
    """Store the new settings and the event naming old and new values (the caller checked them);
    `restart`: the caller restarts the worker now (`LiveWorkers.restart_reason`)."""
    now = clock.now()
    updated = game_store.update_game_settings(session, game.name, {k: wanted[k] for k in SETTABLE if k in wanted}, now)
    when = when_taken({change.takes_effect for change in changes}, restart)
    message = f"{game.name}: {', '.join(str(c) for c in changes)}; {when}"
    details = {"changes": [c.as_dict() for c in changes], "restart": restart}
    create_event(session, now, "settings_changed", message, game=game.name, details=details)
    return updated



def update_settings(db: Database, clock: Clock, name: str, values: Mapping[str, Any], catalog: EnvCheck,
                    restart: bool = False, workers: LiveWorkers = NO_WORKERS, expect: str | None = None) -> SettingsUpdate:
    """`PATCH /games/{name}`: check, store, record (no change, no event). The live worker
    restarts now for new sizes, or with `restart` for any setting it was not started with,
    this request's or an earlier one's (a `--restart` after a plain `set` of the same value).
    `expect`: the `overrides_tag` of the hyperparameters and health settings the caller merged
    its change into; other ones now (changed since it read them) are a conflict, nothing written."""
    wanted = with_defaults(values)
    checked = CheckedOnce(catalog)
    # Every check first, without the write lock (the catalog's check of a `module:Env` id
    # imports the user's module: seconds); then, holding it, the game read again, the tag
    # compared and the changes checked again (the env id's check answered) and written: an
    # apply or set that commits during the first checks is seen, not written over.
    with db.transaction() as session:
        _check_update(session, name, values, wanted, checked, expect)
    with db.transaction(immediate=True) as session:
        game, changes = _check_update(session, name, values, wanted, checked, expect)
        why = workers.restart_reason(with_settings(game, wanted), restart)
        if changes:
            game = record_changes(session, clock, game, wanted, changes, why is not None)
        return SettingsUpdate(game, changes, workers.pending(game), why)


def _check_update(session: Session, name: str, values: Mapping[str, Any], wanted: Mapping[str, Any],
                  catalog: EnvCheck, expect: str | None) -> tuple[GameRecord, list[SettingChange]]:
    """The game as stored now and what `wanted` changes of it, every check passed (or refused)."""
    game = game_store.read_game(session, name)
    if expect is not None and overrides_tag(game.hyperparams, game.health_settings) != expect:
        reason = ("the game's hyperparams or health settings changed since they were read (another apply or "
                  "set): read them again and merge the change into them")
        raise FleetdError(ErrorCode.CONFLICT, f"{EXPECT_FIELD}: {reason}", {"field": EXPECT_FIELD, "reason": reason})
    check_algo(game, values)
    changes = setting_changes(game, wanted)
    if changes:
        check_changes(game, wanted, changes, catalog, session=session)
    return game, changes
