"""The run spec, report encoding, the progress sender and exit codes (docs/worker-protocol.md 1-2, 4)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from workers.__main__ import main
from pydantic import ValidationError

from workers.protocol import reports as reports_module
from workers.protocol.exit_codes import ExitCode, exit_record_path, read_exit_record
from workers.protocol.reports import (CheckpointRef, CheckpointReport, CheckpointSummary, ProgressReport,
                                      ReportError, ResumedReport, SkippedCheckpoint, decode_report,
                                      encode_report, figure, timestamp)
from workers.protocol.sender import ProgressSender
from workers.protocol.spec import RunSpec, SpecError


def test_valid_spec_parses_into_a_frozen_model(make_spec):
    spec = make_spec()
    assert spec.algo == "ppo" and spec.hyperparams.num_envs == 2
    assert spec.device == "auto" and spec.allow_fresh_start is False
    with pytest.raises(ValidationError):
        spec.algo = "dqn"  # type: ignore[misc]
    assert RunSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("surprise", 1, "unknown field"),
    ("run_id", "7", "expected an integer"),
    ("run_id", True, "expected an integer"),
    ("seed", 3.5, "expected an integer"),
    ("seed", float("nan"), "expected an integer"),
    ("checkpoint_interval_s", "600", "expected a number"),
    ("checkpoint_interval_s", float("inf"), "finite"),
    ("progress_interval_s", True, "expected a number"),
    ("total_timesteps", 0, ">= 1"),
    ("algo", "sac", "must be one of"),
    ("device", "tpu", "must be one of"),
    ("checkpoint_interval_s", -1, "> 0"),
    ("allow_fresh_start", "yes", "true or false"),
    ("version", 2, "protocol 1"),
    ("game", "Pong Game", "slug"),
    ("hyperparams", [], "expected an object"),
])
def test_bad_field_is_named_with_reason(tmp_path, make_spec, field, value, reason):
    with pytest.raises(SpecError) as err:
        make_spec(**{field: value})
    assert err.value.field == field
    assert reason in err.value.reason


@pytest.mark.parametrize(("hyperparams", "field"), [
    ({"learing_rate": 0.1}, "hyperparams.learing_rate"),
    ({"num_envs": 0}, "hyperparams.num_envs"),
    ({"learning_rate": "fast"}, "hyperparams.learning_rate"),
    ({"policy_kwargs": {"activation_fn": "swish"}}, "hyperparams.policy_kwargs.activation_fn"),
    ({"learning_rate": float("nan")}, "hyperparams.learning_rate"),
    # Extra policy keys go to SB3 as given, but finite, at any depth
    ({"policy_kwargs": {"net_arch": [64, float("inf")]}}, "hyperparams.policy_kwargs.net_arch"),
    ({"policy_kwargs": {"net_arch": {"pi": [float("-inf")]}}}, "hyperparams.policy_kwargs.net_arch"),
    ({"policy_kwargs": {"ortho_init": float("nan")}}, "hyperparams.policy_kwargs.ortho_init"),
    ({"normalize": 1}, "hyperparams.normalize"),
    ({"n_steps": None}, "hyperparams.n_steps"),
])
def test_bad_hyperparameter_is_named(make_spec, hyperparams, field):
    with pytest.raises(SpecError) as err:
        make_spec(hyperparams=hyperparams)
    assert err.value.field == field


def test_unknown_hyperparameter_reason_lists_the_known_ones(make_spec):
    with pytest.raises(SpecError) as err:
        make_spec(hyperparams={"learing_rate": 0.1})
    assert err.value.reason.startswith("unknown hyperparameter; known for PPO: batch_size, clip_range,")
    assert str(err.value).startswith("run spec field 'hyperparams.learing_rate': unknown hyperparameter")


@pytest.mark.parametrize("required", ["version", "game", "run_id", "env_id", "algo", "checkpoint_dir"])
def test_missing_required_field_is_named(make_spec, required):
    data = make_spec().to_dict()
    del data[required]
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict(data)
    assert err.value.field == required and "missing" in err.value.reason


@pytest.mark.parametrize(("content", "needle"), [
    ({"tier_defaults": {"num_envs": 8, "gpus": 1}}, "tier_defaults.gpus"),
    ({"seed": -1}, "'seed'"),
    # json.dumps writes Infinity and json.loads reads it back: the worker's parser refuses it
    ({"hyperparams": {"policy_kwargs": {"net_arch": [64, float("inf")]}}}, "hyperparams.policy_kwargs.net_arch"),
])
def test_main_returns_bad_spec_exit_code(make_spec, write_spec, caplog, content, needle):
    data = make_spec().to_dict()
    data.update(content)
    path = write_spec(data)
    with caplog.at_level(logging.ERROR):
        assert main(["--spec", str(path)]) == ExitCode.BAD_SPEC
    assert needle in caplog.text


@pytest.mark.parametrize(("hyperparams", "needle"), [  # each passes the spec's own checks
    ({"policy_kwargs": {"optimizer_kwargs": {"eps": -1.0}}}, "ValueError: Invalid epsilon value"),
    ({"policy_kwargs": {"net_arch": ["abc"]}}, "TypeError"),  # a list, as the spec asks (a bare string is refused there)
])
def test_main_returns_bad_spec_when_sb3_refuses_to_build_the_model(make_spec, write_spec, caplog, hyperparams, needle):
    # Settings the spec passes but SB3 refuses as it builds the model: restarting cannot fix
    # them (exit 1 was a crash, restarted until the crash loop went FATAL without the reason).
    data = make_spec().to_dict()
    data["hyperparams"] = {**data["hyperparams"], **hyperparams}
    with caplog.at_level(logging.ERROR):
        assert main(["--spec", str(write_spec(data))]) == ExitCode.BAD_SPEC
    assert "SB3 cannot build a PPO model" in caplog.text and needle in caplog.text


def test_main_unreadable_or_invalid_json_is_bad_spec(tmp_path, caplog):
    assert main(["--spec", str(tmp_path / "absent.json")]) == ExitCode.BAD_SPEC
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["--spec", str(tmp_path / "broken.json")]) == ExitCode.BAD_SPEC


def test_the_worker_process_leaves_its_exit_code_beside_its_spec(tmp_path):
    # A daemon that adopted the worker after a restart is not its parent: it reads this record.
    spec = tmp_path / "run-000007.spec.json"
    spec.write_text('{"version": 1}')
    done = subprocess.run([sys.executable, "-m", "workers", "--spec", str(spec)], capture_output=True, timeout=60)
    assert done.returncode == ExitCode.BAD_SPEC
    assert read_exit_record(exit_record_path(spec)) == ExitCode.BAD_SPEC == int((tmp_path / "run-000007.exit").read_text())
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_an_uncaught_exception_is_recorded_as_the_interpreters_exit_status(tmp_path, monkeypatch):
    import workers.__main__ as entry

    def boom(argv=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(entry, "main", boom)
    spec = tmp_path / "run-000008.spec.json"
    with pytest.raises(RuntimeError):
        entry.main_recorded(["--spec", str(spec)])
    assert read_exit_record(exit_record_path(spec)) == 1


def _reports():
    header = {"game": "pong", "run_id": 7, "pid": 42, "at": 1767200000.0}
    summary = CheckpointSummary("/c/ckpt-000000000128", 128, 3, 1767199990.0, 1234)
    return [
        ProgressReport(**header, steps=128, episodes=3, steps_per_s=10.5, episodes_per_hour=3.0,
                       mean_reward_100=1.5, best_reward=2.0,
                       last_checkpoint=CheckpointRef("/c/ckpt-000000000128", 128, 1767199990.0)),
        ProgressReport(**header, steps=0, episodes=0, steps_per_s=0.0, episodes_per_hour=0.0,
                       mean_reward_100=None, best_reward=None, last_checkpoint=None),
        CheckpointReport(**header, checkpoint=summary),
        ResumedReport(**header, from_="/c/ckpt-000000000128",
                      skipped=(SkippedCheckpoint("/c/ckpt-000000000256", "truncated"),), steps=128),
    ]


@pytest.mark.parametrize("report", _reports(), ids=lambda r: r.type)
def test_reports_round_trip(report):
    data = encode_report(report)
    assert json.loads(data)["v"] == 1
    assert decode_report(data) == report


def test_a_return_that_is_not_finite_is_sent_as_no_figure():
    """A NaN or inf return (an env's reward) reads as null, in a progress report and a checkpoint's."""
    progress, _, checkpoint, _ = _reports()
    odd = dataclasses.replace(progress, mean_reward_100=float("nan"), best_reward=float("inf"), eval_return=float("nan"))
    assert decode_report(encode_report(odd)) == dataclasses.replace(progress, mean_reward_100=None, best_reward=None)
    scored = dataclasses.replace(checkpoint, checkpoint=dataclasses.replace(checkpoint.checkpoint, eval_return=float("-inf")))
    assert decode_report(encode_report(scored)) == checkpoint
    wire = json.loads(encode_report(checkpoint)) | {"checkpoint": "not an object"}
    with pytest.raises(ReportError):
        decode_report(json.dumps(wire).encode())


def _wire(index: int, **changes) -> dict:
    wire = json.loads(encode_report(_reports()[index]))
    for key, value in changes.items():  # "checkpoint__at": a nested field
        *path, last = key.split("__")
        inner = wire
        for part in path:
            inner = inner[part]
        inner[last] = value
    return wire


@pytest.mark.parametrize("index, changes", [
    (0, {"steps_per_s": float("nan")}), (0, {"episodes_per_hour": float("inf")}), (0, {"steps_per_s": "fast"}),
    (0, {"at": float("inf")}), (0, {"at": 1e300}), (0, {"at": float("nan")}), (0, {"at": "now"}),
    (0, {"steps": 2**63}), (0, {"steps": True}), (0, {"episodes": 3.5}), (0, {"run_id": "7"}), (0, {"pid": None}),
    (0, {"game": 5}), (0, {"last_checkpoint__at": float("inf")}), (0, {"last_checkpoint__steps": 1e20}),
    (0, {"last_checkpoint": "ckpt"}), (2, {"checkpoint__at": float("nan")}), (2, {"checkpoint__size_bytes": 2**64}),
    (3, {"skipped": [{"path": 1, "reason": "x"}]}), (3, {"changed": [["lr", 1]]}), (3, {"from": 5}),
    (3, {"refused": "no"}), (3, {"refused": 1}), (3, {"notes": "abc"}), (3, {"notes": [5]}), (3, {"changed": ["abc"]}),
    (3, {"changed": "abc"}), (3, {"changed": [[1, 2, 3]]}), (3, {"skipped": "x"}),
], ids=repr)
def test_a_report_whose_fields_are_not_what_the_protocol_says_is_refused(index, changes):
    """Taken as sent, a NaN steps_per_s failed the recorder's flush (a sample's value is NOT
    NULL), an inf `at` failed datetime.fromtimestamp, a steps past int64 failed SQLite: each in
    the supervision loop, which died, and again at every restart while the worker sent it."""
    with pytest.raises(ReportError):
        decode_report(json.dumps(_wire(index, **changes)).encode())


def test_a_checkpoint_reports_evaluation_failure_round_trips_and_an_older_workers_says_nothing_failed():
    checkpoint = _reports()[2]
    failed = dataclasses.replace(checkpoint, eval_failure="EOFError: ", eval_subprocess_died=True)
    assert decode_report(encode_report(failed)) == failed
    older = {k: v for k, v in json.loads(encode_report(failed)).items() if not k.startswith("eval_")}
    taken = decode_report(json.dumps(older).encode())
    assert (taken.eval_failure, taken.eval_subprocess_died) == (None, False)


@pytest.mark.parametrize("changes, says", [
    ({"eval_failure": 5}, "eval_failure 5 is not a string"), ({"eval_failure": ["x"]}, "eval_failure ['x'] is not a string"),
    ({"eval_subprocess_died": "no"}, "eval_subprocess_died 'no' is not true or false"),
    ({"eval_subprocess_died": 1}, "eval_subprocess_died 1 is not true or false"),
], ids=repr)
def test_a_checkpoint_reports_evaluation_failure_is_checked_as_its_type(changes, says):
    with pytest.raises(ReportError, match=re.escape(f"bad CheckpointReport: {says}")):
        decode_report(json.dumps(_wire(2, **changes)).encode())


def test_a_resumed_reports_notes_changes_and_refusal_round_trip():
    resumed = dataclasses.replace(_reports()[3], notes=("lr changed",), changed=(("lr", 0.1, [1, 2]),), refused=True)
    assert decode_report(encode_report(resumed)) == resumed


def _report_classes():
    """Every report dataclass, nested ones included, found from the report types' fields."""
    found, todo = [], list(reports_module._REPORT_TYPES.values())
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo.extend(getattr(reports_module, word) for f in dataclasses.fields(cls)
                        for word in re.findall(r"\w+", f.type) if dataclasses.is_dataclass(getattr(reports_module, word, None)))
    return found


def test_every_report_class_is_found():
    assert len(_report_classes()) == 6


@pytest.mark.parametrize("cls", _report_classes(), ids=lambda cls: cls.__name__)
def test_every_field_of_every_report_is_checked(cls):
    """A field whose annotation `_field` does not know was let through unchecked (an edit to an
    annotation turned its check off unseen): each must refuse what is no value of its type, or
    read it as no figure (a return)."""
    for f in dataclasses.fields(cls):
        try:
            taken = reports_module._field(cls, f.name, f.type, object())
        except ReportError as exc:
            assert "has no check" not in str(exc), exc
        else:
            assert (f.type, taken) == ("float | None", None), f.name


def test_a_return_that_is_not_a_number_is_no_figure_as_in_a_manifest():
    progress, _, checkpoint, _ = _reports()
    wire = _wire(0, mean_reward_100="high", best_reward=True, eval_return=10**400)
    assert decode_report(json.dumps(wire).encode()) == dataclasses.replace(progress, mean_reward_100=None, best_reward=None)
    assert decode_report(json.dumps(_wire(2, checkpoint__eval_return="high")).encode()) == checkpoint


def test_numpy_numbers_are_numbers_in_a_report_and_a_manifest():
    """A worker's figures may be numpy scalars (an env's np.float32 return, an np.float64 rate):
    each is a number, where `isinstance(x, (int, float))` took np.float64 alone."""
    import numpy as np

    progress = _reports()[0]
    sent = dataclasses.replace(progress, steps_per_s=np.float64(12.5), at=np.float64(progress.at))
    assert decode_report(encode_report(sent)) == dataclasses.replace(progress, steps_per_s=12.5)
    assert (figure(np.float32(2.5)), figure(np.int64(3)), figure(np.float32("inf")), figure(np.bool_(True))) == (2.5, 3.0, None, None)
    assert timestamp(np.int64(1767200000)) == 1767200000.0 and timestamp(np.float64("nan")) is None


def test_the_daemon_logs_a_refused_report_and_reads_the_next(caplog):
    """The real reactor on its socket: the bad datagram is a warning naming its kind, game and
    run, once per kind, game and run (a worker sends one at every interval: it was a warning each
    time, with no game), brackets nested thousands deep are refused (they ended the supervision
    loop: RecursionError), and the good one still reads."""
    from fleetd.supervision.reactor import OsReactor, Reported

    path = Path(tempfile.mkdtemp(prefix="fw-")) / "p.sock"  # AF_UNIX paths: ~107 bytes at most
    reactor = OsReactor(path)
    sent = [_wire(2, checkpoint__at=float("nan")), _wire(0, steps_per_s=float("nan")), _wire(0, steps_per_s=float("inf")),
            _wire(0, run_id=8, steps=-1.5), _wire(0, run_id="7", game=["pong"], steps_per_s="fast"), b"[" * 5000,
            _wire(0)]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            for wire in sent:
                sender.sendto(wire if isinstance(wire, bytes) else json.dumps(wire).encode(), str(path))
        with caplog.at_level(logging.DEBUG, logger="fleetd.supervision.reactor"):
            seen = reactor.wait(1.0)
    finally:
        reactor.close()
        path.parent.rmdir()
    assert seen == [Reported(_reports()[0])]
    refused = [(r.levelno, r.getMessage()) for r in caplog.records if "ignored a malformed" in r.getMessage()]
    assert [(level, message.split(":")[0]) for level, message in refused] == [
        (logging.WARNING, "ignored a malformed checkpoint report (game 'pong', run 7)"),
        (logging.WARNING, "ignored a malformed progress report (game 'pong', run 7)"),  # another kind
        (logging.DEBUG, "ignored a malformed progress report (game 'pong', run 7)"),  # said already
        (logging.WARNING, "ignored a malformed progress report (game 'pong', run 8)"),
        (logging.WARNING, "ignored a malformed progress report (game unknown, run unknown)"),
        (logging.WARNING, "ignored a malformed report (game unknown, run unknown)"),
    ]
    assert refused[-1][1].endswith("not JSON: nested too deep")
    assert "checkpoint__at" not in refused[0][1] and "at nan is not a time" in refused[0][1]


def test_resumed_report_uses_from_key_on_the_wire():
    wire = json.loads(encode_report(_reports()[3]))
    assert wire["from"] == "/c/ckpt-000000000128" and "from_" not in wire


@pytest.mark.parametrize("datagram", [b"nope", b'{"v": 2, "type": "progress"}',
                                      b'{"v": 1, "type": "gossip"}', b'{"v": 1, "type": "progress"}'])
def test_decode_rejects_bad_datagrams(datagram):
    with pytest.raises(ReportError):
        decode_report(datagram)


def test_sender_delivers_to_a_unix_datagram_socket(inbox):
    sender = ProgressSender(str(inbox.path))
    assert sender.send(_reports()[0])
    assert inbox.receive(timeout=5) == _reports()[0]
    sender.close()


def test_sender_drops_silently_when_socket_absent_or_refusing(tmp_path):
    sender = ProgressSender(str(tmp_path / "absent.sock"))
    assert sender.send(_reports()[0]) is False
    refusing = tmp_path / "refusing.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(refusing))
    server.close()  # the path exists but nobody listens: ECONNREFUSED
    assert os.path.exists(refusing)
    sender.path = str(refusing)
    assert sender.send(_reports()[0]) is False
    assert sender.dropped >= 2


def test_sender_without_socket_is_a_no_op():
    assert ProgressSender(None).send(_reports()[0]) is False
