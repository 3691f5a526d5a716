from __future__ import annotations

from pathlib import Path

import pytest

from pydantic import BaseModel

from fleetd.config import DEFAULT_TIERS, MAX_DAYS, MAX_SECONDS, ConfigError, Settings, load_settings
from fleetd.daemon import StartupError, check_listen_policy


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleetd.toml"
    path.write_text(text)
    return path


def test_defaults_match_the_interface_contract() -> None:
    settings = load_settings()
    assert (settings.api.host, settings.api.port) == ("127.0.0.1", 8642)
    assert settings.host.boot_id_path == Path("/proc/sys/kernel/random/boot_id")
    assert settings.state_dir == Path("/var/lib/fleetd")
    assert settings.db_path == Path("/var/lib/fleetd/fleetd.db")


def test_state_dir_follows_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/fleetd-a:/var/lib/other")
    assert load_settings().state_dir == Path("/var/lib/fleetd-a")


def test_toml_file_then_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, 'state_dir = "/srv/fleet"\nlog_level = "debug"\n[api]\nport = 9000\nhost = "127.0.0.2"\n')
    monkeypatch.setenv("FLEETD_API__PORT", "9100")
    settings = load_settings(path)
    assert settings.state_dir == Path("/srv/fleet")
    assert settings.log_level == "DEBUG"
    assert (settings.api.host, settings.api.port) == ("127.0.0.2", 9100)


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETD_CONFIG", str(write(tmp_path, "[host]\nheartbeat_interval_s = 2\n")))
    assert load_settings().host.heartbeat_interval_s == 2


def test_bad_value_names_key_value_and_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, '[api]\nport = "eighty"\n'))
    message = str(caught.value)
    assert "api.port = 'eighty'" in message
    assert "valid integer" in message
    assert "(env " not in message  # from the file, not the environment


def test_out_of_range_and_unknown_keys_are_all_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, "colour = 1\n[api]\nport = 70000\n"))
    problems = caught.value.problems
    assert any(p.startswith("api.port = 70000") and "less than or equal to 65535" in p for p in problems)
    assert any(p.startswith("colour = 1") and "unknown key" in p for p in problems)


def test_bad_environment_value_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETD_HOST__HEARTBEAT_INTERVAL_S", "-3")
    with pytest.raises(ConfigError, match=r"host.heartbeat_interval_s = '-3': Input should be greater than 0"
                                          r".*\(env FLEETD_HOST__HEARTBEAT_INTERVAL_S\)"):
        load_settings()
    monkeypatch.delenv("FLEETD_HOST__HEARTBEAT_INTERVAL_S")
    monkeypatch.setenv("FLEETD_FLEET", '{"prot": 1}')  # a section given whole
    with pytest.raises(ConfigError, match=r"fleet.prot = 1: unknown key .*\(env FLEETD_FLEET\)"):
        load_settings()


@pytest.mark.parametrize(("name", "value", "key"), [
    ("FLEETD_API__PORT", "86_42", "api.port"),
    ("FLEETD_FLEET__TIERS__HEAVY__NUM_ENVS", "64_64", "fleet.tiers.heavy.num_envs"),
    ("FLEETD_SUPERVISOR__STARTSECS", "1_0.5", "supervisor.startsecs"),
    ("FLEETD_CLUSTER__NUM_CPUS_PER_GAME", "6_4", "cluster.num_cpus_per_game"),  # float | None
])
def test_a_numeric_environment_variable_with_digits_grouped_otherwise_is_refused(
        monkeypatch: pytest.MonkeyPatch, name: str, value: str, key: str) -> None:
    # pydantic's lax int and float read a variable's `86_42` as 8642 (the daemon listened where no
    # one meant it to), `64_64` as 6464: the one rule of the CLI's and the API's numbers.
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert f"{key} = {value!r}: {value!r} is not read as a number: underscores may only group digits by " \
           f"thousands (1_000_000, 0.000_001); write {value.replace('_', '')} for that number" in str(caught.value)
    assert f"(env {name})" in str(caught.value), caught.value
    assert "a list as" not in str(caught.value)  # one number: no list is taken


@pytest.mark.parametrize(("name", "value", "says"), [
    ("FLEETD_SUPERVISOR__EXITCODES", '["6_4"]', "supervisor.exitcodes = ['6_4']: exitcodes[0]: '6_4' is not read"),
    ("FLEETD_CLUSTER__PINS", '{"n1": {"GPU": "6_4"}}', "cluster.pins = {'n1': {'GPU': '6_4'}}: pins.n1.GPU: '6_4' is "),
    ("FLEETD_CLUSTER__PINS__N1__GPU", "6_4", ": pins.n1.gpu: '6_4' is not read as a number"),
])
def test_a_number_in_a_list_or_table_with_digits_grouped_otherwise_is_refused(
        monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str) -> None:
    # Read joined: exitcodes [64], a pin's GPU 64.0. Scalars only were walked.
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert says in str(caught.value) and f"(env {name})" in str(caught.value), caught.value
    assert "write 64 for that number" in str(caught.value) and "a list as" not in str(caught.value)


@pytest.mark.parametrize(("toml", "says"), [
    ('[supervisor]\nexitcodes = [1, "6_4"]\n', "exitcodes[1]: '6_4' is not read as a number"),
    ('[cluster.pins.n1]\nGPU = "6_4"\n', "pins.n1.GPU: '6_4' is not read as a number"),
])
def test_a_quoted_number_in_a_list_or_table_of_the_file_is_read_by_the_same_rule(
        tmp_path: Path, toml: str, says: str) -> None:
    path = tmp_path / "fleetd.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert says in str(caught.value), caught.value
    path.write_text(toml.replace("6_4", "1_024"))  # grouped by thousands: read
    settings = load_settings(path)
    assert 1024 in settings.supervisor.exitcodes or settings.cluster.pins == {"n1": {"GPU": 1024.0}}


def test_a_list_variable_that_is_not_json_is_a_config_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # pydantic-settings raised its SettingsError: a traceback, not exit 78 naming the variable.
    monkeypatch.setenv("FLEETD_SUPERVISOR__EXITCODES", "[6_4]")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "FLEETD_SUPERVISOR__EXITCODES = '[6_4]': not a JSON list or table" in str(caught.value), caught.value


def test_a_numeric_environment_variable_grouped_by_thousands_is_read_and_text_is_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETD_API__PORT", "8_642")
    monkeypatch.setenv("FLEETD_API__MAX_BODY_BYTES", "2_000_000")
    monkeypatch.setenv("FLEETD_API__HOST", "gpu_64_64")  # a name, not a number: the rule is numbers'
    settings = load_settings()
    assert (settings.api.port, settings.api.max_body_bytes, settings.api.host) == (8642, 2_000_000, "gpu_64_64")


def test_the_cli_asks_no_port_the_daemon_would_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI's fast reading of [api] port (fleetd/endpoint.py) took `86_42` as 8642, and asked
    # there: "no daemon answers" where the daemon had refused to start over the same variable.
    from typer.testing import CliRunner

    from fleetd.cli.exit_codes import ExitCode
    from fleetd.cli.main import app

    monkeypatch.delenv("FLEETD_CONFIG", raising=False)
    result = CliRunner().invoke(app, ["status"], env={"FLEETD_API__PORT": "86_42", "COLUMNS": "300"})
    assert result.exit_code == ExitCode.CONFIG, result.output
    assert "api.port = '86_42': '86_42' is not read as a number" in result.output, result.output
    assert "(env FLEETD_API__PORT)" in result.output, result.output


def test_an_unknown_top_level_environment_variable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETD_LOGLEVEL", "DEBUG")
    monkeypatch.setenv("FLEETD_STATE_DIRR", "/x")
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, "[api]\nport = 70000\n"))  # reported beside the file's mistakes
    problems = caught.value.problems
    assert [p.split(":")[0] for p in problems[:2]] == ["FLEETD_LOGLEVEL = 'DEBUG'", "FLEETD_STATE_DIRR = '/x'"]
    assert "unknown environment variable" in problems[0] and problems[2].startswith("api.port = 70000")
    for name in ("FLEETD_LOGLEVEL", "FLEETD_STATE_DIRR"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("FLEETD_API_TOKEN", "s" * 32)  # one underscore short: refused, and never echoed
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.problems[0].startswith("FLEETD_API_TOKEN = '<hidden>': unknown") and "sss" not in str(caught.value)
    monkeypatch.delenv("FLEETD_API_TOKEN")
    monkeypatch.setenv("fleetd_config", "/etc/fleetd/fleetd.toml")  # the settings' names in any case, this one not
    with pytest.raises(ConfigError, match="fleetd_config = '/etc/fleetd/fleetd.toml': unknown environment variable"):
        load_settings()
    monkeypatch.delenv("fleetd_config")
    for name, value in (("FLEETD_LOG_LEVEL", "DEBUG"), ("FLEETD_CONFIG", str(write(tmp_path, ""))),
                        ("FLEETD_GPU__MPS", "off"), ("FLEETD_COSTS", "{}")):
        monkeypatch.setenv(name, value)  # every kind of name it reads is still taken
    assert load_settings().log_level == "DEBUG"


def test_a_refused_alert_url_is_not_echoed_in_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A webhook's path and an apprise URL carry the service's token: the error (printed, and in
    the journal under systemd) names the key and why, not the secret, as for the API token."""
    toml = ('[alerts]\nwebhook_url = "hooks.slack.com/services/T0/B0/s3cret1"\n'
            'urls = ["json://127.0.0.1:9/x", "T1JJ3T3L2/A1BRTD4JD/s3cret2"]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, toml))
    assert "s3cret" not in str(caught.value) and "T1JJ3" not in str(caught.value)
    assert caught.value.problems[0].startswith("alerts.webhook_url = '<hidden>': String should match")
    assert caught.value.problems[1].startswith("alerts.urls = '<hidden>': urls[1]: not a URL")
    monkeypatch.setenv("FLEETD_ALERTS_WEBHOOK_URL", "https://hooks.slack.com/services/T0/B0/s3cret3")  # one _ short
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.problems[0].startswith("FLEETD_ALERTS_WEBHOOK_URL = '<hidden>': unknown")
    assert "s3cret" not in str(caught.value)
    monkeypatch.delenv("FLEETD_ALERTS_WEBHOOK_URL")
    with pytest.raises(ConfigError) as caught:  # a misspelt key in a section that holds secrets
        load_settings(write(tmp_path, '[alerts]\nwebhok_url = "https://hooks.slack.com/services/T0/B0/s3cret4"\n'))
    assert caught.value.problems == ["alerts.webhok_url = '<hidden>': unknown key (check its spelling and section)"]


def test_unreadable_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(write(tmp_path, "[api\n"))
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('state_dir = "café"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 16\)"):
        load_settings(latin1)


def test_a_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    # Windows editors put a UTF-8 BOM first: TOML has none, and the daemon refused to start with
    # "not valid TOML: Invalid statement (line 1, column 1)", nothing in the file to see.
    config = tmp_path / "fleetd.toml"
    config.write_bytes(b"\xef\xbb\xbf" + f'state_dir = "{tmp_path / "state"}"\n[api]\nport = 9001\n'.encode())
    settings = load_settings(config)
    assert (settings.api.port, settings.state_dir) == (9001, tmp_path / "state")


def test_token_value_never_echoed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, '[api]\ntoken = "short-secret"\n'))
    assert "short-secret" not in str(caught.value)
    assert "at least 16 characters" in str(caught.value)


def test_non_loopback_needs_a_configured_token() -> None:
    with pytest.raises(StartupError, match="not a loopback address"):
        check_listen_policy(load_settings(api={"host": "0.0.0.0"}))
    check_listen_policy(load_settings(api={"host": "0.0.0.0", "token": "x" * 32}))
    check_listen_policy(load_settings(api={"host": "::1"}))
    check_listen_policy(load_settings(api={"host": "localhost"}))


@pytest.mark.parametrize(
    ("field", "value"),
    [("priority", 5000), ("checkpoint_interval_s", 0.5), ("total_timesteps", 0), ("name", "Bad Name"), ("algo", "sac")],
)
def test_games_entries_and_the_api_refuse_the_same_values(tmp_path: Path, field: str, value: object) -> None:
    """One definition of a game: a value the API refuses, [[games]] refuses too, and vice versa."""
    from pydantic import ValidationError

    from fleetd.api.schemas import GameCreate

    entry = {"name": "pong", "env_id": "Pong-v5", "algo": "ppo", field: value}
    with pytest.raises(ValidationError):
        GameCreate(**entry)
    toml = "[[games]]\n" + "".join(f"{key} = {value!r}\n".replace("'", '"') for key, value in entry.items())
    with pytest.raises(ConfigError, match=rf"games\[0\]\.{field}"):
        load_settings(write(tmp_path, toml))


def test_a_tier_table_changes_only_what_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETD_FLEET__TIERS__LIGHT__GAMES", "3")
    tiers = load_settings(write(tmp_path, "[fleet.tiers.heavy]\nnum_envs = 128\n")).fleet.tiers
    assert (tiers["heavy"].games, tiers["heavy"].num_envs, tiers["heavy"].batch_size) == (8, 128, 2048)
    assert (tiers["light"].games, tiers["light"].num_envs, tiers["light"].batch_size) == (3, 32, 512)
    assert tiers["medium"] == DEFAULT_TIERS["medium"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[fleet.tiers.huge]\ngames = 16\n", "unknown tier 'huge': the tiers are light, medium, heavy"),
        ("[fleet.tiers.light]\ngames = 6\n", "games must not decrease from light to medium to heavy"),
        ("[fleet.tiers.light]\nnum_envs = 128\n", "num_envs must not decrease from light to medium to heavy (light 128, medium 64, heavy 256)"),
        ("[fleet.tiers.heavy]\nnum_envs = 48\n", "num_envs must not decrease from light to medium to heavy (light 32, medium 64, heavy 48)"),
        ("[fleet.tiers.medium]\nnum_envs = 0\n", "fleet.tiers.medium.num_envs = 0"),
    ],
)
def test_a_bad_tier_table_is_named(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text))
    assert expected in str(caught.value)


# Each turned into a timedelta, a scheduler's next run or a thread join once the workers run.
INTERVALS = [("fleet", "telemetry_interval_s"), ("gpu", "mps_check_s"), ("backup", "db_interval_s"),
             ("backup", "checkpoint_scan_s"), ("plan", "record_interval_s"), ("fleet", "crash_window_s"),
             ("supervisor", "stopwaitsecs")]


@pytest.mark.parametrize(("section", "key"), INTERVALS)
def test_an_interval_that_is_not_finite_or_past_a_week_is_refused_at_start(tmp_path: Path, section: str, key: str) -> None:
    """TOML's inf passed `gt=0` and crashed the daemon after its workers had started
    (OverflowError in timedelta); a huge finite value did the same."""
    for value, reason in [("inf", "Input should be a finite number"), ("nan", "Input should be a finite number"),
                          ("1e12", f"Input should be less than or equal to {MAX_SECONDS}")]:
        with pytest.raises(ConfigError) as caught:
            load_settings(write(tmp_path, f"[{section}]\n{key} = {value}\n"))
        assert caught.value.problems == [f"{section}.{key} = {float(value)!r}: {reason}"]
    assert getattr(getattr(load_settings(write(tmp_path, f"[{section}]\n{key} = {MAX_SECONDS}\n")), section), key) == MAX_SECONDS


def test_no_float_setting_takes_inf_or_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every section's every float: `gt=0` alone lets inf through (as FLEETD_..._S=inf does)."""
    floats = [(name, key) for name, field in Settings.model_fields.items()
              if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
              for key, sub in field.annotation.model_fields.items() if sub.annotation in (float, float | None)]
    assert len(floats) > 40
    for section, key in floats:
        for value in ("inf", "nan"):
            variable = f"FLEETD_{section.upper()}__{key.upper()}"
            monkeypatch.setenv(variable, value)
            with pytest.raises(ConfigError, match=rf"{section}\.{key} = '{value}': Input should be a finite number"):
                load_settings()
            monkeypatch.delenv(variable)


@pytest.mark.parametrize(("section", "key"), [("retention", "events_days"), ("retention", "samples_days"),
                                              ("retention", "set_aside_days"), ("plan", "keep_days")])
def test_a_retention_past_a_century_is_refused_at_start(tmp_path: Path, section: str, key: str) -> None:
    """`events_days = 1000000` passed and the hourly retention job raised OverflowError
    (`now - timedelta(days=...)`) before it deleted anything."""
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, f"[{section}]\n{key} = 1000000\n"))
    assert caught.value.problems == [f"{section}.{key} = 1000000: Input should be less than or equal to {MAX_DAYS}"]
    assert getattr(getattr(load_settings(write(tmp_path, f"[{section}]\n{key} = {MAX_DAYS}\n")), section), key) == MAX_DAYS


def test_absent_in_the_configs_games_says_where_it_belongs(tmp_path: Path) -> None:
    # "unknown key (check its spelling and section)": it is spelt right, in a fleet file's entry.
    config = tmp_path / "fleetd.toml"
    config.write_text('[[games]]\nname = "pong"\nenv_id = "Pong-v5"\nabsent = true\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    (problem,) = caught.value.problems
    assert problem.startswith("games[0].absent = True: unknown key here: `absent` is a fleet file's (`fleetd apply`)")
    assert "fleetd games rm" in problem
