"""Log lines under journald carry sd-daemon priority prefixes; elsewhere they carry timestamps."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetd.logs import JournalFormatter, log_formatter, stderr_is_journal, syslog_priority


def record(level: int, message: str, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("fleetd.test", level, __file__, 1, message, None, exc_info)


@pytest.mark.parametrize(
    ("level", "priority"),
    [
        (logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6), (logging.DEBUG, 7),
        (logging.WARNING + 5, 4), (logging.INFO - 1, 7), (logging.NOTSET, 7),
    ],
)
def test_syslog_priority_of_each_level(level: int, priority: int) -> None:
    assert syslog_priority(level) == priority


def test_journal_formatter_prefixes_the_record() -> None:
    text = JournalFormatter("%(levelname)s %(name)s: %(message)s").format(record(logging.WARNING, "disk slow"))
    assert text == "<4>WARNING fleetd.test: disk slow"


def test_journal_formatter_prefixes_every_line_of_a_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        exc_info = sys.exc_info()
    lines = JournalFormatter("%(message)s").format(record(logging.ERROR, "two\nlines", exc_info)).splitlines()
    # journald takes each line of a stream on its own: an unprefixed line would be stored as info.
    assert len(lines) > 3 and all(line.startswith("<3>") for line in lines)
    assert lines[:2] == ["<3>two", "<3>lines"] and lines[-1] == "<3>RuntimeError: boom"


def test_plain_formatter_outside_journald_has_timestamps_and_no_prefix() -> None:
    text = log_formatter(under_journald=False).format(record(logging.WARNING, "disk slow"))
    assert not text.startswith("<") and text.endswith("WARNING fleetd.test: disk slow")


def test_stderr_is_journal_compares_device_and_inode(tmp_path: Path) -> None:
    path = tmp_path / "stream"
    with path.open("w") as stream:
        info = os.fstat(stream.fileno())
        assert stderr_is_journal({"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"}, stream)
        # Inherited from a parent whose stderr was the journal: a different inode here.
        assert not stderr_is_journal({"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino + 1}"}, stream)
        for value in ("", "garbage", f"{info.st_dev}:", ":1"):
            assert not stderr_is_journal({"JOURNAL_STREAM": value}, stream)
        assert not stderr_is_journal({}, stream)


def test_stderr_without_a_descriptor_is_not_the_journal() -> None:
    import io

    assert not stderr_is_journal({"JOURNAL_STREAM": "1:1"}, io.StringIO())


SCRIPT = """
import logging
from fleetd.logs import configure_logging
configure_logging("INFO")
logging.getLogger("fleetd.x").warning("careful")
logging.getLogger("fleetd.x").info("fine")
"""


@pytest.mark.parametrize("matches", [True, False])
def test_configure_logging_prefixes_only_when_stderr_is_the_journal(tmp_path: Path, matches: bool) -> None:
    path = tmp_path / "stderr"
    with path.open("w") as stderr:
        info = os.fstat(stderr.fileno())
        stream = f"{info.st_dev}:{info.st_ino if matches else info.st_ino + 1}"
        env = {**os.environ, "JOURNAL_STREAM": stream, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        subprocess.run([sys.executable, "-c", SCRIPT], stderr=stderr, env=env, check=True, timeout=60)
    lines = path.read_text().splitlines()
    if matches:
        assert lines == ["<4>WARNING fleetd.x: careful", "<6>INFO fleetd.x: fine"]
    else:
        assert [line.split(" ", 2)[2] for line in lines] == ["WARNING fleetd.x: careful", "INFO fleetd.x: fine"]
