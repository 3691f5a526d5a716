"""Bearer-token auth for everything under /api/v1."""

from __future__ import annotations

import hmac

from fastapi import Depends
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
    # Constant time, so the comparison does not leak how much of a guess was right.
    if not hmac.compare_digest(credentials.credentials.encode(), context.token.encode()):
        raise FleetdError(ErrorCode.UNAUTHORIZED, "invalid bearer token")
