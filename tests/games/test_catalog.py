"""The env catalog: listed by a real subprocess, warmed on a thread when the daemon starts."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

from fleetd.games.catalog import EnvCatalog
from fleetd.errors import ErrorCode, FleetdError


def test_warm_lists_the_registries_once_and_requests_then_take_them_without_a_subprocess(monkeypatch) -> None:
    catalog = EnvCatalog(sys.executable)
    catalog.warm().join(180)
    assert {"CartPole-v1", "Breakout-v5"} <= catalog.ids()

    def no_second_listing() -> list[str]:
        raise AssertionError("listed twice")

    monkeypatch.setattr(catalog, "_list", no_second_listing)
    catalog.check("CartPole-v1")
    with pytest.raises(FleetdError) as caught:
        catalog.check("CartPol-v1")
    assert caught.value.code is ErrorCode.VALIDATION and "CartPole-v1" in caught.value.details["close_matches"]


def test_a_warm_up_that_fails_is_logged_and_the_first_request_gets_the_reason(tmp_path: Path, caplog) -> None:
    missing = tmp_path / "no-such-python"
    catalog = EnvCatalog(str(missing))
    with caplog.at_level(logging.WARNING, logger="fleetd.games.catalog"):
        catalog.warm().join(30)
    assert any("cannot list the env registries" in r.getMessage() for r in caplog.records)
    with pytest.raises(FleetdError) as caught:  # not cached: asked again, failing with its reason
        catalog.check("CartPole-v1")
    assert caught.value.code is ErrorCode.INTERNAL and str(missing) in caught.value.message


def test_close_ends_a_listing_under_way_and_says_nothing(tmp_path: Path, caplog) -> None:
    """A daemon that stops while the registries are being listed leaves no process behind."""
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    catalog = EnvCatalog(str(slow))
    with caplog.at_level(logging.WARNING, logger="fleetd.games.catalog"):
        thread = catalog.warm()
        deadline = time.monotonic() + 10
        while catalog._child is None and time.monotonic() < deadline:
            time.sleep(0.02)
        child = catalog._child
        assert child is not None, "the listing did not start"
        catalog.close()
        thread.join(10)
    assert not thread.is_alive() and child.poll() is not None  # killed, and reaped by communicate
    assert caplog.records == []
    with pytest.raises(FleetdError, match="stopping"):
        catalog.ids()
