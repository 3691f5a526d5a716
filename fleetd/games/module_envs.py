"""Env ids of the form `module:EnvName-vN`: a user's own Gymnasium env, registered by importing
`module` (Gymnasium's own form: `gymnasium.make` imports the module, then makes the env).

The daemon never imports the module: a subprocess of the workers' Python does
(`python -m workers.catalog --module-env`, run by `catalog.EnvCatalog`), and what it found is
judged here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from fleetd.errors import ErrorCode, FleetdError

# A dotted module path, one colon, then a Gymnasium id (an optional namespace/, name, -vN).
MODULE_ENV_ID = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<env>(?:[\w.-]+/)?[\w.-]+)", re.ASCII)
FORM = "module:EnvName-vN (a Python module that registers EnvName-vN with Gymnasium when imported)"
MODULE_FORM_HINT = "name it module:EnvName-vN (docs/worker.md#your-own-gymnasium-envs)"
HOW = ("install its package in the workers' Python environment, or put its folder on the service's "
       "PYTHONPATH (docs/worker.md#your-own-gymnasium-envs)")


@dataclass(frozen=True)
class ModuleEnvFindings:
    """What importing the module did: its error's last line, else whether the id is then
    registered and which ids the import registered."""

    import_error: str | None = None
    found: bool = False
    registered: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, text: str) -> ModuleEnvFindings:
        """The last line of the child's output: a module may print while it is imported."""
        data = json.loads(text.strip().splitlines()[-1])
        return cls(data.get("import_error"), bool(data.get("found")), tuple(data.get("registered", ())))

    @property
    def usable(self) -> bool:
        return self.import_error is None and self.found


def check_form(env_id: str, field: str) -> None:
    if MODULE_ENV_ID.fullmatch(env_id) is None:
        raise _refusal(field, f"{env_id!r} is not of the form {FORM}", "not of the form module:EnvName-vN")


def check_findings(env_id: str, field: str, findings: ModuleEnvFindings, python: str) -> None:
    """Nothing when the workers can make `env_id`; else the 422 that says why."""
    module, _, name = env_id.partition(":")
    if findings.import_error is not None:
        raise _refusal(field, f"{env_id!r}: module {module!r} does not import in the workers' Python ({python}): "
                              f"{findings.import_error}; {HOW}",
                       f"module {module} does not import: {findings.import_error}")
    if not findings.found:
        ids = ", ".join(findings.registered) if findings.registered else "none"
        raise _refusal(field, f"{env_id!r}: importing {module!r} registers no {name!r}; the Gymnasium ids it "
                              f"registers: {ids}",
                       f"module {module} registers no {name}", registered=list(findings.registered))


def _refusal(field: str, message: str, reason: str, **details: object) -> FleetdError:
    return FleetdError(ErrorCode.VALIDATION, f"{field}: {message}",
                       {"errors": [{"field": field, "reason": reason}], **details})
