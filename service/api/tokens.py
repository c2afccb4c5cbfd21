"""The token routes: issue (admin), list, revoke; and who am I."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool as run

from service.api import recovery
from service.api.deps import CurrentActor, CurrentPrincipal, Deps, read_body
from service.api.indoubt import settled
from service.api.routes import NAME, json_response
from service.app.auth import IssuedToken, Role, TokenService, new_secret, require
from service.app.errors import Invalid
from service.app.workloads import validation_problems


class TokenRequest(BaseModel):
    model_config = {"extra": "forbid"}
    name: str = Field(min_length=1, max_length=128, pattern=NAME)
    role: Role
    namespaces: list[str] = Field(default_factory=list, max_length=256)
    expiresInSeconds: int | None = Field(  # noqa: N815 (the API's camelCase)
        default=None,
        ge=1,
        le=int(TokenService.MAX_TTL.total_seconds()),
        description="How long the token lives; 90 days when not given.",
    )


def token_router() -> APIRouter:
    router = APIRouter(tags=["Token"])
    admin = frozenset({Role.ADMIN})

    @router.post("/v1/tokens", status_code=201)
    async def issue(request: Request, actor: CurrentActor, deps: Deps) -> Any:
        """Issue a bearer token for a role (admin only). The secret is shown once."""
        require(actor.principal, admin)
        body = await read_body(request, deps.settings.max_body_bytes)
        try:
            wanted = TokenRequest.model_validate(body)
        except ValidationError as error:
            raise Invalid("invalid token request", validation_problems(error)) from None
        # Chosen here, so that an answer lost with the database can be given
        # again: only the secret's hash is stored.
        secret = new_secret()
        life = wanted.expiresInSeconds
        args = (
            actor.principal.name,
            wanted.name,
            wanted.role,
            wanted.namespaces,
            actor.request_id,
            None if life is None else timedelta(seconds=life),
            secret,
        )
        issue = deps.authenticator.issue
        return await settled(request, recovery.issued_token(secret), _issued, issue, *args)

    @router.get("/v1/tokens")
    async def list_tokens(principal: CurrentPrincipal, deps: Deps) -> Any:
        """Issued tokens (never their secrets)."""
        require(principal, admin)
        return {"items": await run(deps.authenticator.list)}

    @router.delete("/v1/tokens/{token_id}", status_code=204)
    async def revoke(request: Request, token_id: UUID, actor: CurrentActor, deps: Deps) -> Response:
        require(actor.principal, admin)

        def revoke() -> UUID:
            deps.authenticator.revoke(actor.principal.name, token_id, actor.request_id)
            return token_id

        return await settled(request, recovery.revoked_token(token_id), _revoked, revoke)

    @router.get("/v1/whoami")
    async def whoami(principal: CurrentPrincipal) -> Any:
        """The caller's name, roles and namespaces."""
        return {
            "name": principal.name,
            "roles": sorted(principal.roles),
            "namespaces": sorted(principal.namespaces),
        }

    return router


async def _issued(issued: IssuedToken) -> Response:
    """The token as issued, with its secret: shown this once."""
    body = {
        "id": str(issued.id),
        "name": issued.name,
        "role": issued.role.value,
        "namespaces": issued.namespaces,
        "token": issued.token,
        "createdAt": issued.created_at.isoformat(),
        "expiresAt": issued.expires_at.isoformat(),
    }
    return json_response(body, 201)


async def _revoked(_: UUID) -> Response:
    return Response(status_code=204)
