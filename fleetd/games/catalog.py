"""Which env ids exist: EnvPool's and Gymnasium's registries, listed once by a subprocess; and
a user's own `module:EnvName-vN`, checked per id by a subprocess that imports the module."""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Protocol

from fleetd.errors import ErrorCode, FleetdError
from fleetd.games.module_envs import MODULE_FORM_HINT, ModuleEnvFindings, check_findings, check_form
from workers.protocol import MODULE_IMPORT_TIMEOUT_S, is_module_env_id  # a slower import is refused

log = logging.getLogger(__name__)
LISTING_TIMEOUT_S = 120
# A module env that does not check out is asked again after this long, not the next minute's
# requests each (an apply retried in a loop): the user may install the package and retry.
REFUSAL_KEPT_S = 10.0


class EnvCheck(Protocol):
    """What checking a game's env id takes: `EnvCatalog`, or one that remembers its answers
    (`fleetd apply` checks each id once, before its write transaction)."""

    def check(self, env_id: str, field: str = "env_id") -> None: ...


class CheckedOnce:
    """The catalog's check, asked once per env id: the checks before a write transaction ask
    it (slow: a listing, a module's import), the same checks inside it find it answered."""

    def __init__(self, catalog: EnvCheck) -> None:
        self._catalog = catalog
        self._passed: set[str] = set()

    def check(self, env_id: str, field: str = "env_id") -> None:
        if env_id not in self._passed:
            self._catalog.check(env_id, field)
            self._passed.add(env_id)


class EnvCatalog:
    def __init__(self, python: str = "", monotonic: Callable[[], float] = time.monotonic) -> None:
        self._python = python or sys.executable
        self._monotonic = monotonic
        self._ids: frozenset[str] | None = None
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen] = set()  # the listing, a module check: for close()
        self._closed = False
        self._module_envs: dict[str, tuple[ModuleEnvFindings, float]] = {}  # id -> findings, asked at
        self._module_lock = threading.Lock()  # one user module imported at a time

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
        """The daemon is stopping: end a listing or a check still under way, and what it
        started (its processes are ours, and must not outlive the daemon); later requests fail
        at once."""
        self._closed = True
        for child in list(self._children):
            _kill_group(child)

    def interrupt(self) -> None:
        """close() for a signal handler (the daemon stopping during start-up): kills without
        waiting, and the wait under way (the listing, a module check) then ends at once."""
        self._closed = True
        for child in list(self._children):
            _kill_group(child, wait=False)

    def _list(self) -> list[str]:
        try:
            return list(json.loads(self._run([], LISTING_TIMEOUT_S)))
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise self._failure("list the env registries", exc) from None

    def _failure(self, doing: str, exc: Exception) -> FleetdError:
        # The child's last stderr line is usually the reason (an import that failed).
        last = _last_line(getattr(exc, "stderr", None))
        why = f" ({last})" if last else ""
        return FleetdError(ErrorCode.INTERNAL, f"cannot {doing} with {self._python}: {exc}{why}")

    def _run(self, args: list[str], timeout_s: float) -> str:
        """`python -m workers.catalog ARGS`'s output, its process kept where close() can kill it.

        In a process group of its own, writing to files, not pipes: a user's module may start
        processes at import (a server, a pool) that would hold a pipe open past the answer, and
        those die with the group once the child has answered or run out of time."""
        if self._closed:
            raise OSError("the daemon is stopping")
        command = [self._python, "-m", "workers.catalog", *args]
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            child = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                     start_new_session=True, text=True)
            self._children.add(child)
            if self._closed:  # close() ran while it started
                _kill_group(child)
            try:
                child.wait(timeout=timeout_s)
            finally:
                _kill_group(child)
                self._children.discard(child)
            stdout, stderr = _read(out), _read(err)
        if child.returncode != 0:
            raise subprocess.CalledProcessError(child.returncode, command, stdout, stderr)
        return stdout

    def check(self, env_id: str, field: str = "env_id") -> None:
        if is_module_env_id(env_id):
            check_form(env_id, field)
            check_findings(env_id, field, self._module_env(env_id), self._python)
            return
        ids = self.ids()
        if env_id in ids:
            return
        close = difflib.get_close_matches(env_id, sorted(ids), n=5, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        hint += f"; for your own env, {MODULE_FORM_HINT}"
        raise FleetdError(
            ErrorCode.VALIDATION,
            f"{field}: {env_id!r} is not an EnvPool or Gymnasium env id{hint}",
            {"errors": [{"field": field, "reason": "unknown env id"}], "close_matches": close},
        )

    def _module_env(self, env_id: str) -> ModuleEnvFindings:
        """What importing the module of `env_id` does: kept for good once it checks out (as
        the listing is), else for REFUSAL_KEPT_S."""
        with self._module_lock:
            now = self._monotonic()
            self._module_envs = {k: v for k, v in self._module_envs.items() if v[0].usable or now < v[1]}
            if env_id not in self._module_envs:
                findings = self._import_module_env(env_id)
                self._module_envs[env_id] = (findings, self._monotonic() + REFUSAL_KEPT_S)
            return self._module_envs[env_id][0]

    def _import_module_env(self, env_id: str) -> ModuleEnvFindings:
        """A module that ends its process, crashes the interpreter or answers nothing readable
        at import is refused like one that raises: the import is what failed, not fleetd."""
        try:
            return ModuleEnvFindings.from_json(self._run(["--module-env", env_id], MODULE_IMPORT_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            return ModuleEnvFindings(import_error=f"the import did not finish within {MODULE_IMPORT_TIMEOUT_S} s")
        except subprocess.CalledProcessError as exc:
            if self._closed:  # killed by close(): the daemon is stopping, not the module's doing
                raise self._failure(f"check {env_id!r}", exc) from None
            why = _last_line(exc.stderr) or "no error printed"
            return ModuleEnvFindings(import_error=f"the importing process exited with {_exit_text(exc.returncode)} ({why})")
        except (ValueError, IndexError):
            return ModuleEnvFindings(import_error="the importing process printed no answer (it ended before it could)")
        except OSError as exc:
            raise self._failure(f"check {env_id!r}", exc) from None


def _kill_group(child: subprocess.Popen, wait: bool = True) -> None:
    """The child and whatever it started in its session (start_new_session: pgid = its pid);
    `wait`: for the child to end, 5 s at most (not in a signal handler: `interrupt`)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    if wait:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)


def _last_line(text: str | None) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else None


def _read(handle) -> str:
    handle.seek(0)
    return handle.read()


def _exit_text(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
