"""The fleet as a file (`fleetd apply`, `PUT /fleet/spec`, `fleetd export-spec`): the config's
`[[games]]` entries, plus `absent = true` for a game that must go. Applying computes a plan
(add, update, restart, stop, remove, or nothing per game), checks all of it, then writes it in
one transaction; the same file applied again plans nothing, so it writes nothing and no event
(with `restart`, a live worker still without stored settings plans a restart, which writes nothing)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from fleetd.clock import Clock
from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.catalog import CheckedOnce, EnvCheck
from fleetd.games.kept import KeptFiles, refuse
from fleetd.games.lifecycle import (busy_midway, check_draft, check_unique_names, forget_samples_of_removable,
                                    record_added, record_desired, record_removed, refuse_start_while_removed, removable,
                                    removing, seeding_needed)
from fleetd.games.settings import (
    NO_WORKERS,
    LiveWorkers,
    SettingChange,
    change_refusals,
    check_changes,
    check_identity,
    record_changes,
    setting_changes,
    with_settings,
)
from fleetd.games.slug import GameName
from fleetd.games.fields import AT_EVALUATION, AT_GOVERNOR_STEP, AT_START, PENDING_NOTE, SIZES_NOTE
from fleetd.games.spec import DEFAULT_ALGO, SETTABLE, GameSpec
from fleetd.states import DONE, TRAINING, Desired, State
from fleetd.store import games as game_store
from fleetd.store.engine import Database
from fleetd.store.records import GameDraft, GameRecord

if TYPE_CHECKING:
    from fleetd.store.engine import Session  # the store's; only the store imports SQLAlchemy

Action = Literal["add", "update", "restart", "stop", "remove", "none"]
Found = tuple[KeptFiles, int]  # a removed game's checkpoints under a name, and the newest one's step count


def _boolean(value: Any) -> Any:
    """`absent` is true or false: 0 and 1 are not taken for them."""
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


class FleetGame(GameSpec):
    """A fleet file's `[[games]]` entry: the config's entry, with `absent = false` allowed."""

    absent: Literal[False] = Field(False, description="true: the game must not be there (an AbsentGame entry)")
    _bool = field_validator("absent", mode="before")(lambda value: _boolean(value))

    def wanted(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in SETTABLE}


class AbsentGame(BaseModel):
    """`absent = true`: the game must not be there; stopped, then removed (files kept). Only the
    name counts: the entry's other keys may stay (one line takes a game out) and are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    name: GameName
    absent: Literal[True]
    _bool = field_validator("absent", mode="before")(lambda value: _boolean(value))


def _entry_kind(value: Any) -> str:
    absent = value.get("absent") if isinstance(value, dict) else getattr(value, "absent", False)
    return "absent" if absent is True else "present"


FleetEntry = Annotated[
    Annotated[FleetGame, Tag("present")] | Annotated[AbsentGame, Tag("absent")], Discriminator(_entry_kind)
]


@dataclass(frozen=True)
class GamePlan:
    name: str
    action: Action
    changes: list[SettingChange] = field(default_factory=list)
    note: str = ""
    restarting: bool = False
    waiting: bool = False  # marked absent, still stopping: removed by an apply once stopped


# -- planning ----------------------------------------------------------------------------------


def plan_fleet(session: Session, games: list[FleetGame | AbsentGame], catalog: EnvCheck, restart: bool,
               workers: LiveWorkers = NO_WORKERS,
               kept: Mapping[str, Found | FleetdError | None] | None = None) -> list[GamePlan]:
    """What applying `games` would do, every entry checked first (FleetdError names the culprit).
    `kept`: for each name the fleet lacked (`kept_of_new`), the checkpoints a removed game left
    under it, or why they could not be looked for: met only once every entry passed its own
    checks, so a bad entry is named first. An add of a name not in it is refused (removed since)."""
    check_unique_names([entry.name for entry in games])
    current = {game.name: game for game in game_store.read_games(session)}
    plans = [_plan(session, index, entry, current.get(entry.name), catalog, restart, workers)
             for index, entry in enumerate(games)]
    for index, (entry, plan) in enumerate(zip(games, plans)):
        if plan.action == "add" and kept is not None and entry.name not in kept:
            _refuse_removed_meanwhile(index, entry.name)
        found = (kept or {}).get(entry.name)
        if plan.action == "add" and isinstance(found, FleetdError):
            raise found
        if plan.action == "add" and found is not None:
            _refuse_kept(f"games[{index}].", entry, *found)
    return plans


def _plan(session: Session, index: int, entry: FleetGame | AbsentGame, game: GameRecord | None, catalog: EnvCheck,
          restart: bool, workers: LiveWorkers) -> GamePlan:
    prefix = f"games[{index}]."
    if isinstance(entry, AbsentGame):
        return _plan_absent(entry.name, game)
    if game is None:
        check_draft(_draft(entry), catalog, prefix)
        return GamePlan(entry.name, "add", note=f"added ({entry.env_id}, {entry.algo}), desired {entry.desired}")
    if "algo" not in entry.model_fields_set and entry.algo != game.algo and entry.env_id == game.env_id:
        _refuse_algo_left_out(prefix, game)
    check_identity(game, entry.env_id, entry.algo, prefix)
    changes = setting_changes(game, entry.wanted())
    check_changes(game, entry.wanted(), changes, catalog, prefix, session)
    if game.desired != entry.desired:
        changes.append(SettingChange("desired", game.desired.value, entry.desired.value))
    return _plan_update(entry, game, changes, restart, workers)


def _refuse_algo_left_out(prefix: str, game: GameRecord) -> NoReturn:
    """An entry without `algo` is a PPO game's: for a game of another algorithm that is no change
    of algorithm the user asked for (nor one to give another name), but a line left out."""
    field = f"{prefix}algo"
    reason = (f"the entry leaves algo out, which makes it {DEFAULT_ALGO}; game {game.name!r} is {game.algo}: "
              f'add algo = "{game.algo}" to its entry')
    raise FleetdError(ErrorCode.CONFLICT, f"{field}: {reason}", {"errors": [{"field": field, "reason": reason}]})


def _plan_update(entry: FleetGame, game: GameRecord, changes: list[SettingChange], asked: bool,
                 workers: LiveWorkers) -> GamePlan:
    """A game in both: what changes, and whether its live worker restarts now (asked, for
    settings it was not started with; or new sizes, in any case)."""
    after = with_settings(game, entry.wanted())
    again = entry.desired is Desired.RUNNING and workers.restart_reason(after, asked) is not None
    changed = {change.field for change in changes}
    pending = [change for change in workers.pending(after) if change.field not in changed]  # an earlier change's
    if not changes:
        return _plan_unchanged(entry.name, pending, again)
    ended = game if entry.desired is Desired.RUNNING and game.state in DONE else None
    return GamePlan(entry.name, "update", changes, note=_when(changes, pending, again, asked, ended),
                    restarting=again)


def _plan_unchanged(name: str, pending: list[SettingChange], again: bool) -> GamePlan:
    """The file matches the game; its live worker may still run with older settings (applied
    without `--restart`): `--restart` restarts it for them, else they wait for its next start."""
    listed = ", ".join(map(str, pending))
    if again:
        return GamePlan(name, "restart", note=f"restarts now from a final checkpoint to apply the pending change: "
                                              f"{listed}", restarting=True)
    if pending:
        return GamePlan(name, "none", note=f"unchanged; {PENDING_NOTE}: {listed}")
    return GamePlan(name, "none", note="unchanged")


WAITS = "settings apply at its next start"
PRIORITY_NOTE = ("priority takes effect at the governor's next step: it orders the pending queue, and a pending "
                 "game that outranks a running one takes its slot once that one has held it [fleet] "
                 "preempt_min_run_s (unless [fleet] preempt = false); `fleetd games start NAME --now` takes it at once")
DESIRED_NOTE = {Desired.RUNNING: "it starts at the supervisor's next turn where a slot is free, else waits pending",
                Desired.STOPPED: "it stops at the supervisor's next turn, from a final checkpoint"}
HEALTH_NOTE = "health settings take effect at its next learning-health evaluation, with no restart"
ENDED_NOTE = "it stays {state}: an apply does not start it again; `fleetd games start {name}` does"


def _when(changes: list[SettingChange], pending: list[SettingChange], again: bool, asked: bool,
          ended: GameRecord | None = None) -> str:
    """What the plan says of an update: the worker's settings wait for a start (unless restarted:
    asked, or new sizes, which only a restart applies); priority and health settings do not.
    `ended`: a FATAL or EXITED game the file wants running, which only `games start` starts again."""
    effects = {change.takes_effect for change in changes}
    said = []
    if AT_START in effects or again or pending:
        training = "restarts now from a final checkpoint" if again else WAITS
        training += f", with the pending change: {', '.join(map(str, pending))}" if pending else ""
        training += "" if asked or not again else f" ({SIZES_NOTE})"
        said.append(training)
    said += [HEALTH_NOTE] if AT_EVALUATION in effects else []
    said += [PRIORITY_NOTE] if AT_GOVERNOR_STEP in effects else []
    if ended is not None:
        return "; ".join(said + [ENDED_NOTE.format(state=ended.state, name=ended.name)])
    # A start or stop is said with whatever else changes (it was said only when nothing else did).
    said += [DESIRED_NOTE[change.new] for change in changes if change.field == "desired"]
    return "; ".join(said)


def _refuse_kept(prefix: str, entry: FleetGame, files: KeptFiles, steps: int) -> NoReturn:
    """A file cannot say what to do with a removed game's checkpoints: `games add` says it once."""
    refuse(files, steps, f"{prefix}name", f"add it first with `fleetd games add {entry.name} {entry.env_id} "
           "--kept resume|set-aside` (resume: train on from them, only with that game's env_id, algo and network; "
           "set-aside: start afresh with them moved aside), then apply; or give it another name")


def kept_of_new(db: Database, games: list[FleetGame | AbsentGame],
                files_of: Callable[[str], KeptFiles]) -> dict[str, Found | FleetdError | None]:
    """Each entry to add (a name the fleet lacks now): the checkpoints a removed game left under
    its name (None: none), or why a URL storage could not be asked (the plan raises it once the
    entries passed their checks). Looked for before the plan's transaction: a listing at a URL
    storage must not hold it open."""
    with db.transaction() as session:
        current = {game.name for game in game_store.read_games(session)}
    new = [files_of(entry.name) for entry in games if isinstance(entry, FleetGame) and entry.name not in current]
    return {files.name: _newest(files) for files in new}


def _refuse_removed_meanwhile(index: int, name: str) -> NoReturn:
    """An entry the plan adds whose name the fleet held when the kept checkpoints were looked
    for: its game was removed since (`fleetd games rm` while the file's env ids were checked),
    so its checkpoints were never looked for. Adding it could resume from them with no choice
    asked; applying again looks, and refuses it if they are there."""
    field = f"games[{index}].name"
    reason = (f"game {name!r} was removed while this apply was checked: its folder may hold its checkpoints, "
              "not looked for; apply again")
    raise FleetdError(ErrorCode.CONFLICT, f"{field}: {reason}", {"field": field, "name": name})


def _newest(files: KeptFiles) -> Found | FleetdError | None:
    try:
        steps = files.newest_steps()
    except FleetdError as exc:
        return exc
    return None if steps is None else (files, steps)


def _plan_absent(name: str, game: GameRecord | None) -> GamePlan:
    if game is None:
        return GamePlan(name, "none", note="absent: not there")
    if removable(game):
        return GamePlan(name, "remove", note=f"removed; its files kept (it was {game.state})")
    if game.desired is Desired.STOPPED:
        still = "stopping" if game.state is State.STOPPING else f"{game.state}, stopping"
        return GamePlan(name, "none", note=f"absent: still {still}; apply again once stopped to remove it",
                        waiting=True)
    change = SettingChange("desired", game.desired.value, Desired.STOPPED.value)
    return GamePlan(name, "stop", [change], note=f"{_stopping(game)}; apply again once stopped to remove it")


def _stopping(game: GameRecord) -> str:
    """How a game the file marks absent, that should run, stops (desired `stopped`): a worker
    writes a final checkpoint first; a game in back-off has none running, nothing to write."""
    if game.state in TRAINING:
        return "stopped now (a final checkpoint)"
    if game.state is State.STOPPING:  # a restart's stop: its worker is writing a final checkpoint
        return "stopping already (a final checkpoint), and now stays stopped"
    if game.state is State.BACKOFF:
        return "stopped now: in back-off, no worker runs (nothing to checkpoint)"
    # Stopped, exited or fatal with a run not yet closed: its worker may still be alive.
    return f"stopped now: {game.state}, but its last run is not closed yet (its worker may still be alive)"


def _draft(entry: FleetGame) -> GameDraft:
    return GameDraft(**entry.model_dump(exclude={"absent"}))


# -- applying ----------------------------------------------------------------------------------


def apply_fleet(db: Database, clock: Clock, games: list[FleetGame | AbsentGame], catalog: EnvCheck,
                files_of: Callable[[str], KeptFiles], dry_run: bool = False, restart: bool = False,
                workers: LiveWorkers = NO_WORKERS) -> list[GamePlan]:
    """Plan, check, and (unless `dry_run`) write every change in one transaction; a `restart`
    plan writes nothing (the caller restarts the worker). `files_of`: where a game of that name
    keeps checkpoints; an entry to add is refused where a removed game left some."""
    entries = {entry.name: entry for entry in games}
    kept = kept_of_new(db, games, files_of)
    checked = CheckedOnce(catalog)
    # Every check first, without the write lock: checking a `module:Env-vN` id imports the
    # user's module (up to MODULE_IMPORT_TIMEOUT_S), and the supervisor's writes wait at most
    # busy_timeout for the lock, then fail. Planned again inside, against the games as written
    # (a removal, as remove_game), where the env ids are the ones already checked.
    with db.transaction() as session:
        plans = plan_fleet(session, games, checked, restart, workers, kept)
    if dry_run:
        return plans
    gone = [plan.name for plan in plans if plan.action == "remove"]
    # Every guard before any game's samples go; a busy database's 503 says nothing was written
    # but (where a batch committed) samples: the whole apply is asked again.
    with removing(*gone), busy_midway(*gone, again="apply again; nothing else in this apply was written") as forgotten:
        for name in gone:  # its samples a batch a transaction first, as remove_game's
            forget_samples_of_removable(db, name, forgotten)
        with db.transaction(immediate=True) as session:
            plans = plan_fleet(session, games, checked, restart, workers, kept)
            for plan in plans:
                _write(session, clock, plan, entries[plan.name])
    return plans


def left_alone(db: Database, plans: list[GamePlan]) -> list[str]:
    """The fleet's games a file does not name, which its apply leaves as they are: a game whose
    entry was deleted from the file is not taken out (only `absent = true` does that)."""
    named = {plan.name for plan in plans}
    with db.transaction() as session:
        return sorted(game.name for game in game_store.read_games(session) if game.name not in named)


def _write(session: Session, clock: Clock, plan: GamePlan, entry: Any) -> None:
    if plan.action == "add":
        draft = _draft(entry)
        record_added(session, clock.now(), draft, game_store.create_game(session, draft, clock.now()))
    elif plan.action == "remove":
        game_store.delete_game(session, plan.name)
        record_removed(session, clock.now(), plan.name, "its files kept (absent in the fleet file)")
    elif plan.action in ("update", "stop"):
        _write_update(session, clock, plan, entry)


def _write_update(session: Session, clock: Clock, plan: GamePlan, entry: Any) -> None:
    settings = [c for c in plan.changes if c.field != "desired"]
    if settings:
        game = game_store.read_game(session, plan.name)
        record_changes(session, clock, game, entry.wanted(), settings, plan.restarting)
    if any(c.field == "desired" for c in plan.changes):
        desired = Desired.STOPPED if isinstance(entry, AbsentGame) else entry.desired
        if desired is Desired.RUNNING:
            refuse_start_while_removed(plan.name)  # as `games start` is: a removal would take it anyway
        game_store.update_game_desired(session, plan.name, desired, clock.now())
        record_desired(session, clock.now(), plan.name, desired)


# -- the config's [[games]] after the first start -----------------------------------------------


def seeds_not_applied(db: Database, seeds: list[GameSpec]) -> str | None:
    """[[games]] seeds a database that never had games, once (lifecycle.seeding_needed); after that
    the config's entries change nothing, and a config edited since would say nothing of it. Says
    which entries the database lacks or holds with other settings (as `fleetd apply` compares
    them), and how to apply them. `desired` is left out: it is the operator's start and stop."""
    if not seeds or seeding_needed(db):
        return None
    with db.transaction() as session:
        held = {game.name: game for game in game_store.read_games(session)}
        refused = _settings_refused(session, held, seeds)
    missing = [seed.name for seed in seeds if seed.name not in held]
    differing = [f"{seed.name} ({'; '.join(map(str, changes))})" for seed in seeds if seed.name in held
                 and (changes := _seed_changes(held[seed.name], seed))]  # fmt: skip
    if not missing and not differing:
        return None
    found = "; ".join(([f"not in the database: {', '.join(missing)}"] if missing else []) + (
        [f"held with other settings (database -> config): {', '.join(differing)}"] if differing else []))
    return ("[[games]] in the config is not applied: this database already had games, and [[games]] seeds only "
            f"a database that never had any. {found[0].upper() + found[1:]}. To apply them: put these entries in a "
            "file and run `fleetd apply FILE` (`--dry-run` first shows what it would change); or take them out of the "
            f"config{_identity_refused(held, seeds)}{refused}{_desired_applied(held, seeds)}")


def _identity_refused(held: dict[str, GameRecord], seeds: list[GameSpec]) -> str:
    """An entry with another env_id or algo than its game's is refused by `fleetd apply` (409),
    the whole file with it: said, with what to do instead."""
    left_out = [seed for seed in seeds if seed.name in held and "algo" not in seed.model_fields_set
                and held[seed.name].algo != seed.algo and held[seed.name].env_id == seed.env_id]
    names = [seed.name for seed in seeds if seed.name in held and seed not in left_out
             and (held[seed.name].env_id, held[seed.name].algo) != (seed.env_id, seed.algo)]
    said = ""
    if names:
        said += (f". `fleetd apply` refuses the entries of {', '.join(names)} as they are: another env_id or algo than "
                 "the game's is never changed in place (its checkpoints are of those); give such an entry another "
                 "name, or remove the game first (`fleetd games rm`)")
    if left_out:
        lines = ", ".join(f'algo = "{held[seed.name].algo}" for {seed.name}' for seed in left_out)
        said += (f". `fleetd apply` refuses the entries of {', '.join(seed.name for seed in left_out)} as they are: "
                 f"each leaves algo out, which makes it {DEFAULT_ALGO}, and its game is of another algorithm: add its "
                 f"algo line ({lines})")
    return said


def _settings_refused(session: Session, held: dict[str, GameRecord], seeds: list[GameSpec]) -> str:
    """An entry whose hyperparameter `fleetd apply` refuses (422), the whole file with it, as
    `games set` would (a line deleted whose value the trained model keeps, a key its checkpoints
    fix): said with why, where it was advised to apply them as they are."""
    refused = [f"{seed.name} ({field}: {why})" for seed in seeds if (game := held.get(seed.name)) is not None
               and (game.env_id, game.algo) == (seed.env_id, seed.algo)  # another identity: said already
               for field, why in change_refusals(game, setting_changes(game, _settable(seed)), session)]
    if not refused:
        return ""
    return f". `fleetd apply` refuses these as they are: {'; '.join(refused)}"


def _settable(seed: GameSpec) -> dict[str, Any]:
    return {key: getattr(seed, key) for key in SETTABLE}


def _desired_applied(held: dict[str, GameRecord], seeds: list[GameSpec]) -> str:
    """An applied entry sets its game's desired state too, running unless it says otherwise:
    games the operator stopped (`fleetd games stop`) would start. Said, with how to keep them."""
    moved = [seed for seed in seeds if seed.name in held and held[seed.name].desired != seed.desired]
    starts = [seed.name for seed in moved if seed.desired is Desired.RUNNING]
    stops = [seed.name for seed in moved if seed.desired is Desired.STOPPED]
    said = []
    if starts:
        said.append(f"Applied as they are, the entries also start {', '.join(starts)}, stopped in the database: an "
                    'entry without desired = "stopped" starts its game (give it that line to keep it stopped)')
    if stops:
        said.append(f"Applied as they are, the entries also stop {', '.join(stops)}, running in the database: "
                    'their entries say desired = "stopped"')
    return "".join(f". {sentence}" for sentence in said)


def _seed_changes(game: GameRecord, seed: GameSpec) -> list[SettingChange]:
    identity = [SettingChange(key, getattr(game, key), getattr(seed, key)) for key in ("env_id", "algo")
                if getattr(game, key) != getattr(seed, key)]  # fmt: skip
    return identity + setting_changes(game, _settable(seed))


# -- exporting ---------------------------------------------------------------------------------


def export_fleet(db: Database) -> list[FleetGame]:
    """Every game as a fleet-file entry: applying the result changes nothing."""
    with db.transaction() as session:
        games = game_store.read_games(session)
    return [FleetGame(name=g.name, env_id=g.env_id, algo=g.algo, desired=g.desired,  # type: ignore[arg-type]
                      **{key: getattr(g, key) for key in SETTABLE}) for g in games]


def to_toml(games: list[dict[str, Any]]) -> str:
    """`[[games]]` tables; keys at their default or unset are left out."""
    defaults = {key: info.get_default(call_default_factory=True)
                for key, info in FleetGame.model_fields.items() if not info.is_required()}
    blocks = []
    for game in games:
        lines = ["[[games]]"]
        lines += [f"{key} = {toml_value(value)}" for key, value in game.items()
                  if value is not None and value != defaults.get(key) and key != "absent"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n" if blocks else ""


def toml_value(value: Any) -> str:
    """A JSON value as TOML (dicts inline). Strings as TOML basic strings (`_string`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _string(key)


def _string(text: str) -> str:
    """A JSON string is a TOML basic string where it escapes only what TOML reads back the
    same: characters as themselves (json's ASCII escapes write a character beyond U+FFFF as
    two surrogates, which TOML refuses), and DEL escaped (TOML refuses it bare; json leaves it)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")

