"""Which env ids exist: EnvPool's and Gymnasium's registries, listed once by a subprocess."""

from __future__ import annotations

import difflib
import json
import logging
import subprocess
import sys
import threading

from fleetd.errors import ErrorCode, FleetdError


log = logging.getLogger(__name__)
LISTING_TIMEOUT_S = 120


class EnvCatalog:
    def __init__(self, python: str = "") -> None:
        self._python = python or sys.executable
        self._ids: frozenset[str] | None = None
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None  # the listing under way, for close()
        self._closed = False

    def ids(self) -> frozenset[str]:
        with self._lock:
            if self._ids is None:
                self._ids = frozenset(self._list())
            return self._ids

    def warm(self) -> threading.Thread:
        """List the registries on a thread now, so that the first request naming an env id
        (an add, an apply) does not wait for the listing: importing EnvPool and Gymnasium takes
        seconds, over ten on a loaded host, which is a CLI's whole timeout. A request that comes
        first waits on the same listing; a failure is logged and met again, with its reason,
        by the first request that needs the ids."""

        def list_quietly() -> None:
            try:
                log.info("env ids listed: %d", len(self.ids()))
            except FleetdError as exc:
                if not self._closed:
                    log.warning("%s", exc.message)

        thread = threading.Thread(target=list_quietly, name="env-catalog", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """The daemon is stopping: end a listing still under way (its process is ours, and
        must not outlive the daemon); later requests fail at once."""
        self._closed = True
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()

    def _list(self) -> list[str]:
        try:
            return list(json.loads(self._run_listing()))
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            # The child's last stderr line is usually the reason (an import that failed).
            stderr = (getattr(exc, "stderr", None) or "").strip().splitlines()
            why = f" ({stderr[-1]})" if stderr else ""
            raise FleetdError(
                ErrorCode.INTERNAL, f"cannot list the env registries with {self._python}: {exc}{why}"
            ) from None

    def _run_listing(self) -> str:
        """`python -m workers.catalog`'s output, its process kept where close() can kill it."""
        if self._closed:
            raise OSError("the daemon is stopping")
        command = [self._python, "-m", "workers.catalog"]
        self._child = child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if self._closed:  # close() ran while it started
            child.kill()
        try:
            stdout, stderr = child.communicate(timeout=LISTING_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
        finally:
            self._child = None
        if child.returncode != 0:
            raise subprocess.CalledProcessError(child.returncode, command, stdout, stderr)
        return stdout

    def check(self, env_id: str, field: str = "env_id") -> None:
        ids = self.ids()
        if env_id in ids:
            return
        close = difflib.get_close_matches(env_id, sorted(ids), n=5, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise FleetdError(
            ErrorCode.VALIDATION,
            f"{field}: {env_id!r} is not an EnvPool or Gymnasium env id{hint}",
            {"errors": [{"field": field, "reason": "unknown env id"}], "close_matches": close},
        )
