"""The config's `[fleet] tier` and `[[games]]` count at the first start only: a later start whose
config differs from the database says so (a WARNING in the log, a `config_not_applied` event),
and one whose config matches, or leaves the tier at its default, says nothing. Real config
files, a real SQLite store, the start-up's steps in the daemon's order (fleetd/daemon.py
`_record_and_run`); tests/host/test_state_dir_e2e.py does the same with real `fleetd serve`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetd.config import Settings, load_settings
from fleetd.daemon import CONFIG_NOT_APPLIED, say_config_not_applied
from fleetd.games.lifecycle import check_seeds, seed_games, seeding_needed, set_desired
from fleetd.governor.controller import FleetController
from fleetd.states import Desired
from fleetd.store import games as game_store
from fleetd.store.engine import Database
from fleetd.store.events import EventFilter, read_events
from fleetd.store.fleet import read_fleet, update_fleet_requested
from fleetd.store.records import GameDraft
from fleetd.store.schema import ensure_schema
from tests.api_context import CATALOG
from tests.fakes import FakeClock

CART = '[[games]]\nname = "cart"\nenv_id = "CartPole-v1"\npriority = 1\n'


class Starts:
    """Starts of the daemon on one state_dir, each with the config file as it is then."""

    def __init__(self, root: Path) -> None:
        self.root, self.clock = root, FakeClock()
        (root / "boot_id").write_text("11111111-1111-1111-1111-111111111111\n")
        self.db: Database | None = None

    def settings(self, toml: str) -> Settings:
        path = self.root / "fleetd.toml"
        path.write_text(f'state_dir = "{self.root / "state"}"\n[host]\nboot_id_path = "{self.root / "boot_id"}"\n' + toml)
        return load_settings(path)

    def start(self, toml: str) -> list[str]:
        """Seed [[games]] where the database never had games, say what of the config is not
        applied, then the governor's row (created from the config's tier at the first start)."""
        settings = self.settings(toml)
        if self.db is None:
            ensure_schema(settings.db_path, "fleetd db upgrade")
            self.db = Database.open(settings.db_path)
        if settings.games and seeding_needed(self.db):
            seed_games(self.db, self.clock, check_seeds(settings.games, CATALOG))
        notes = say_config_not_applied(self.db, settings, self.clock)
        FleetController(settings.fleet, self.db, self.clock, telemetry=None)
        return notes

    def events(self) -> list[str]:
        assert self.db is not None
        with self.db.transaction() as session:
            events = read_events(session, EventFilter(kind=CONFIG_NOT_APPLIED))
        assert all(event.severity == "warning" for event in events)
        return [event.message for event in events]

    def requested(self) -> str:
        assert self.db is not None
        with self.db.transaction() as session:
            record = read_fleet(session)
        assert record is not None
        return record.requested


@pytest.fixture
def starts(tmp_path: Path) -> Iterator[Starts]:
    starts = Starts(tmp_path)
    yield starts
    if starts.db is not None:
        starts.db.close()


def test_a_config_that_matches_the_database_says_nothing(starts: Starts) -> None:
    config = '[fleet]\ntier = "medium"\n' + CART
    assert starts.start(config) == []  # the first start applies both
    assert starts.start(config) == []
    assert starts.db is not None
    set_desired(starts.db, starts.clock, "cart", Desired.STOPPED)  # `fleetd games stop cart`: not a setting
    with starts.db.transaction() as session:  # `fleetd games add`: a game the config does not list
        game_store.create_game(session, GameDraft("pong", "CartPole-v1", "ppo"), starts.clock.now())
    assert starts.start(config) == [] and starts.events() == []


def test_a_tier_the_config_leaves_at_its_default_says_nothing(starts: Starts) -> None:
    assert starts.start("") == []
    assert starts.db is not None
    with starts.db.transaction() as session:
        update_fleet_requested(session, "heavy", starts.clock.now())  # `fleetd tier heavy`
    assert starts.start("[fleet]\nstart_games = 2\n") == [] and starts.events() == []


def test_an_edited_tier_is_named_with_how_to_change_it(starts: Starts, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """The audit: a restart with FLEETD_FLEET__TIER=auto logged nothing and stayed manual/medium."""
    assert starts.start('[fleet]\ntier = "medium"\n') == []
    monkeypatch.setenv("FLEETD_FLEET__TIER", "auto")
    with caplog.at_level(logging.WARNING, logger="fleetd.daemon"):
        notes = starts.start('[fleet]\ntier = "medium"\n')
    expected = ("[fleet] tier = auto in the config (or FLEETD_FLEET__TIER) is not applied: the database's tier, "
                "medium (manual), rules (set by `fleetd tier` or an earlier start; the config's tier counts at the "
                "first start only). To change it: fleetd tier auto")
    assert notes == [expected] and starts.events() == [expected]
    assert [record.getMessage() for record in caplog.records] == [expected]
    assert starts.requested() == "medium"  # still the database's: the warning changes nothing


def test_edited_games_are_named_with_fleetd_apply(starts: Starts) -> None:
    assert starts.start(CART) == []
    edited = CART.replace("priority = 1", "priority = 5\nhyperparams = { learning_rate = 0.001 }")
    notes = starts.start(edited + '[[games]]\nname = "pong"\nenv_id = "CartPole-v1"\n')
    assert notes == [
        "[[games]] in the config is not applied: this database already had games, and [[games]] seeds only a "
        "database that never had any. Not in the database: pong; held with other settings (database -> config): "
        "cart (priority 1 -> 5; hyperparams.learning_rate default -> 0.001). To apply them: put these entries in a "
        "file and run `fleetd apply FILE` (`--dry-run` first shows what it would change); or take them out of the config"
    ]
    assert starts.events() == notes
    assert starts.db is not None
    with starts.db.transaction() as session:
        assert [(g.name, g.priority) for g in game_store.read_games(session)] == [("cart", 1)]


def test_games_removed_since_their_seeding_are_named_too(starts: Starts) -> None:
    """Seeded once: a game removed is not seeded again, and the config that still lists it says so."""
    assert starts.start(CART) == []
    assert starts.db is not None
    with starts.db.transaction() as session:
        game_store.delete_game(session, "cart")
    notes = starts.start(CART)
    assert len(notes) == 1 and "Not in the database: cart." in notes[0]


def test_the_advice_to_apply_says_which_stopped_games_that_would_start(starts: Starts) -> None:
    """`fleetd apply` of the config's entries sets desired too (running where they say nothing):
    the advice named only the settings, and applying it started games the operator had stopped."""
    two = CART + '[[games]]\nname = "pong"\nenv_id = "CartPole-v1"\n'
    assert starts.start(two) == []
    assert starts.db is not None
    for name in ("cart", "pong"):
        set_desired(starts.db, starts.clock, name, Desired.STOPPED)  # `fleetd games stop`
    kept = two.replace('name = "pong"', 'name = "pong"\ndesired = "stopped"')
    [note] = starts.start(kept.replace("priority = 1", "priority = 5"))
    assert note.endswith(
        "or take them out of the config. Applied as they are, the entries also start cart, stopped in the database: "
        'an entry without desired = "stopped" starts its game (give it that line to keep it stopped)'), note
    assert "pong" not in note  # its entry keeps it stopped, and its settings match
    set_desired(starts.db, starts.clock, "pong", Desired.RUNNING)
    [note] = starts.start(kept.replace("priority = 1", "priority = 5"))
    assert note.endswith('Applied as they are, the entries also stop pong, running in the database: their entries '
                         'say desired = "stopped"'), note


def test_the_advice_to_apply_says_that_another_env_is_refused(starts: Starts) -> None:
    """An entry edited to another env_id was named among "other settings" with the advice to
    `fleetd apply` it, which refuses it (409: never changed in place), and the whole file with it."""
    assert starts.start(CART) == []
    [note] = starts.start(CART.replace('env_id = "CartPole-v1"', 'env_id = "Acrobot-v1"'))
    assert "Held with other settings (database -> config): cart (env_id CartPole-v1 -> Acrobot-v1)" in note
    assert note.endswith("or take them out of the config. `fleetd apply` refuses the entries of cart as they are: "
                         "another env_id or algo than the game's is never changed in place (its checkpoints are of "
                         "those); give such an entry another name, or remove the game first (`fleetd games rm`)"), note


def test_an_entry_whose_algo_line_was_deleted_is_told_to_name_it_not_to_rename_it(starts: Starts) -> None:
    """A DQN game's entry without its `algo` line is a PPO game's: the note said to give it
    another name, as for another algorithm asked for; `fleetd apply` says to add the line."""
    assert starts.start(CART + 'algo = "dqn"\n') == []
    [note] = starts.start(CART)
    assert note.endswith("`fleetd apply` refuses the entries of cart as they are: each leaves algo out, which makes "
                         'it ppo, and its game is of another algorithm: add its algo line (algo = "dqn" for cart)'), note
    assert "another name" not in note


def test_the_advice_to_apply_says_which_entries_apply_refuses_as_they_are(starts: Starts) -> None:
    """A `learning_rate` line deleted from a trained game's entry was named among "other
    settings" with the advice to `fleetd apply` them, which refuses the file (422: the model
    keeps the value). The note says so, with why."""
    from fleetd.store.games import update_games_progress
    from fleetd.store.records import ProgressSnapshot

    lr = CART + "hyperparams = { learning_rate = 0.001, gamma = 0.98 }\n"
    assert starts.start(lr) == []
    assert starts.db is not None
    with starts.db.transaction() as session:
        update_games_progress(session, {"cart": ProgressSnapshot(5000, 20, None, 30.0, 50.0, starts.clock.now())})
    [note] = starts.start(CART + "hyperparams = { gamma = 0.98 }\n")
    assert "cart (hyperparams.learning_rate 0.001 -> default)" in note
    assert ("`fleetd apply` refuses these as they are: cart (hyperparams.learning_rate: cannot be unset once the "
            "game has trained: its model keeps the value it has (0.001)") in note, note
    # A changed value, which apply takes, is advised without it.
    [note] = starts.start(CART + "hyperparams = { learning_rate = 0.002, gamma = 0.98 }\n")
    assert "refuses" not in note
