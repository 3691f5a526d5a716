"""Bearer-token auth, and the refusal of unknown query parameters, for everything under /api/v1."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fleetd.api.context import AppContext, get_context
from fleetd.errors import ErrorCode, FleetdError

_bearer = HTTPBearer(auto_error=False, description="the token in state_dir/api-token or [api] token")


def require_token(
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
    context: AppContext = Depends(get_context),
) -> None:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise FleetdError(ErrorCode.UNAUTHORIZED, "missing bearer token (Authorization: Bearer <token>)")
    if not token_matches(credentials.credentials, context.token):
        raise FleetdError(ErrorCode.UNAUTHORIZED, "invalid bearer token")


def token_matches(sent: str, token: str) -> bool:
    # Constant time, so the comparison does not leak how much of a guess was right.
    return hmac.compare_digest(sent.encode(), token.encode())


def refuse_unknown_query(request: Request) -> None:
    """A query parameter the operation does not take is a typo (`?limt=5`), not something to
    ignore, like an unknown field in a body."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = {param.alias for param in _query_params(dependant)}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        errors = [{"field": f"query.{name}", "reason": "unknown parameter"} for name in unknown]
        message = f"unknown query parameter {', '.join(unknown)}; this operation takes {', '.join(sorted(known)) or 'none'}"
        raise FleetdError(ErrorCode.VALIDATION, message, {"errors": errors})


def _query_params(dependant: Any) -> list[Any]:
    params = list(dependant.query_params)
    for sub in dependant.dependencies:
        params += _query_params(sub)
    return params
