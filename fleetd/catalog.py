"""Which env ids exist: EnvPool's and Gymnasium's registries, listed once by a subprocess."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
import threading

from fleetd.errors import ErrorCode, FleetdError


class EnvCatalog:
    def __init__(self, python: str = "") -> None:
        self._python = python or sys.executable
        self._ids: frozenset[str] | None = None
        self._lock = threading.Lock()

    def ids(self) -> frozenset[str]:
        with self._lock:
            if self._ids is None:
                self._ids = frozenset(self._list())
            return self._ids

    def _list(self) -> list[str]:
        command = [self._python, "-m", "workers.catalog"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
            return list(json.loads(done.stdout))
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            # The child's last stderr line is usually the reason (an import that failed).
            stderr = (getattr(exc, "stderr", None) or "").strip().splitlines()
            why = f" ({stderr[-1]})" if stderr else ""
            raise FleetdError(
                ErrorCode.INTERNAL, f"cannot list the env registries with {self._python}: {exc}{why}"
            ) from None

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
