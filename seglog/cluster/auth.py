"""Bearer tokens and per-database permissions for the node API.

The tokens file has one line per token::

    # TOKEN                            PRINCIPAL  PERMS
    3f9c0c1e5a7d4b2e8f6a1c0d9e8b7a6f   ingest     orders:write,metrics:write
    a1b2c3d4e5f60718293a4b5c6d7e8f90   ops        admin

``PERMS`` is a comma-separated list of ``read``, ``write`` and ``admin``, each either global
or limited to one database as ``DB:perm``. ``#`` starts a comment; blank lines are skipped.
Tokens are at least 16 characters.

Permissions are ranked, each implying the ones below it on the same scope: ``admin`` >
``write`` > ``read``. A producer must describe a database to route records (read), and an
operator who may drop a database could as well read it; a separate data-only role is a
token with ``write`` or ``read`` alone. Which permission each route needs is the table in
:mod:`seglog.cluster.server` (next to the routes).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from seglog.db_config import validate_db_name
from seglog.errors import AuthenticationFailed, InvalidArgument, InvalidName, PermissionDenied

__all__ = [
    "MIN_TOKEN_CHARS",
    "PRINCIPAL",
    "Need",
    "Perm",
    "Principal",
    "TokenTable",
    "auth_middleware",
    "bearer_token",
    "may_read",
    "require",
]

MIN_TOKEN_CHARS: Final = 16


class Perm(IntEnum):
    """A permission; a higher one implies the lower ones on the same scope."""

    READ = 1
    WRITE = 2
    ADMIN = 3


@dataclass(frozen=True)
class Principal:
    """Who a token belongs to and what it may do.

    Attributes:
        name: The principal named in the tokens file (logs and errors; never the token).
        grants: ``(database or None for all, permission)`` pairs.
    """

    name: str
    grants: frozenset[tuple[str | None, Perm]]

    def allows(self, perm: Perm, db: str | None = None) -> bool:
        """Whether this principal holds ``perm`` on ``db`` (``None``: on every database)."""
        return any(
            p >= perm and (scope is None or (db is not None and scope == db)) for scope, p in self.grants
        )


@dataclass(frozen=True)
class Need:
    """What a route needs: a permission, on the path's ``{db}`` or globally.

    Attributes:
        perm: The permission (``None``: the route is open, no token needed).
        on_db: Checked here on the path's ``{db}`` (globally when the path has none). When
            false the middleware only authenticates and the handler checks the databases it
            acts on (``POST /v1/dbs`` the named one, listings filter what they show).
    """

    perm: Perm | None
    on_db: bool = True


PRINCIPAL: Final = web.RequestKey("seglog_principal", Principal)

# What a route missing from the table needs: global admin.
_UNLISTED: Final = Need(Perm.ADMIN, on_db=False)

_PERM_NAMES: Final = {"read": Perm.READ, "write": Perm.WRITE, "admin": Perm.ADMIN}


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class TokenTable:
    """The tokens of a node, looked up in constant time."""

    def __init__(self, entries: Iterable[tuple[str, Principal]]) -> None:
        """A table of ``(token, principal)`` pairs.

        Raises:
            InvalidArgument: A token is given twice.
        """
        # Only SHA-256 digests are kept: equal length (compare_digest leaks length otherwise),
        # and a memory dump or a repr never shows a token.
        self._entries: list[tuple[bytes, Principal]] = []
        seen: set[bytes] = set()
        for token, principal in entries:
            digest = _digest(token)
            if digest in seen:
                raise InvalidArgument(f"a token of principal {principal.name!r} is listed twice")
            seen.add(digest)
            self._entries.append((digest, principal))

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def from_file(cls, path: str | Path) -> TokenTable:
        """Parse a tokens file (format in the module docstring).

        Raises:
            InvalidArgument: The file is malformed; the message names the line, never the token.
            OSError: The file cannot be read.
        """
        text = Path(path).read_text(encoding="utf-8")
        entries = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{path}, line {number}"
            fields = line.split()
            if len(fields) != 3:
                raise InvalidArgument(f"{where}: expected TOKEN PRINCIPAL PERMS, got {len(fields)} fields")
            token, name, perms = fields
            if len(token) < MIN_TOKEN_CHARS:
                raise InvalidArgument(f"{where}: the token is shorter than {MIN_TOKEN_CHARS} characters")
            entries.append((token, Principal(name, _parse_perms(perms, where))))
        return cls(entries)

    def lookup(self, token: str) -> Principal | None:
        """The principal of ``token``, or ``None``.

        Every entry is compared, with no early exit, so the time taken does not tell which
        entry (or whether any) matched nor how much of a token was right.
        """
        digest = _digest(token)
        found: Principal | None = None
        for stored, principal in self._entries:
            if hmac.compare_digest(stored, digest):
                found = principal
        return found


def _parse_perms(perms: str, where: str) -> frozenset[tuple[str | None, Perm]]:
    grants: set[tuple[str | None, Perm]] = set()
    for item in perms.split(","):
        scope, _, name = item.rpartition(":")
        perm = _PERM_NAMES.get(name)
        if perm is None:
            raise InvalidArgument(
                f"{where}: unknown permission {name[:40]!r} (read, write, admin or DB:perm)"
            )
        if scope:
            try:
                validate_db_name(scope)
            except InvalidName as exc:
                raise InvalidArgument(f"{where}: {exc}") from None
        grants.add((scope or None, perm))
    return frozenset(grants)


def bearer_token(request: web.Request) -> str | None:
    """The token of ``Authorization: Bearer TOKEN``, if the request carries one."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def require(request: web.Request, perm: Perm, db: str | None) -> None:
    """Raise :class:`PermissionDenied` unless the request's principal holds ``perm`` on ``db``.

    A request without a principal (a node without tokens) may do anything.
    """
    principal = request.get(PRINCIPAL)
    if principal is not None and not principal.allows(perm, db):
        scope = f"database {db!r}" if db is not None else "every database"
        raise PermissionDenied(f"{principal.name} lacks {perm.name.lower()} on {scope}")


def may_read(request: web.Request, db: str) -> bool:
    """Whether the request's principal may read ``db`` (always, on a node without tokens)."""
    principal = request.get(PRINCIPAL)
    return principal is None or principal.allows(Perm.READ, db)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(tokens: TokenTable, needs: dict[tuple[str, str], Need]) -> Middleware:
    """A middleware checking the bearer token and the route's :class:`Need` from ``needs``.

    ``needs`` maps ``(method, path template)`` to what the route needs. A route missing from
    it needs global admin (fail closed: a new route is never open by accident). Unmatched
    paths (404/405) need a valid token, so they tell a stranger nothing about the API.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        method = "GET" if request.method == "HEAD" else request.method
        need = None if resource is None else needs.get((method, resource.canonical), _UNLISTED)
        if need is not None and need.perm is None:
            return await handler(request)
        token = bearer_token(request)
        principal = None if token is None else tokens.lookup(token)
        if principal is None:
            raise AuthenticationFailed(
                "a valid token is required (Authorization: Bearer TOKEN)"
                if token is None
                else "unknown token"
            )
        request[PRINCIPAL] = principal
        if need is _UNLISTED:
            require(request, Perm.ADMIN, None)
        elif need is not None and need.on_db:
            assert need.perm is not None
            require(request, need.perm, request.match_info.get("db"))
        return await handler(request)

    return middleware
