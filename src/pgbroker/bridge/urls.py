"""Broker URLs: the parts every connector reads (host, port, user, password, path) and its
options in the query string, checked against the options it knows, and the ``where`` text that
names a broker in logs and errors without its password."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from pgbroker._credentials import hide_passwords
from pgbroker.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    scheme: str
    host: str
    port: int
    username: str | None
    password: str | None
    path: str  # unquoted, without the leading "/"
    options: dict[str, str]

    def hostport(self) -> str:
        return f"{self.host}:{self.port}"


def parse(
    url: str,
    *,
    schemes: Collection[str],
    default_port: int,
    options: Collection[str],
    hint: str,
    default_host: str = "127.0.0.1",
) -> BrokerUrl:
    """The parts of ``url``; InvalidArgument for another scheme, a bad port, an option not in
    ``options`` or one given twice (``hint`` says how to write one)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidArgument(f"malformed broker URL: {hide_passwords(str(exc), url)}", hint=hint) from None
    if parts.scheme not in schemes:
        wanted = " or ".join(f"{s}://" for s in sorted(schemes))
        raise InvalidArgument(
            f"this URL must start with {wanted}, got {parts.scheme or 'no scheme'}://", hint=hint
        )
    if parts.fragment:
        raise InvalidArgument(
            f"the URL has a fragment #{parts.fragment}; write # in a name as %23", hint=hint
        )
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    unknown = sorted({k for k, _ in pairs} - set(options))
    if unknown:
        known = ", ".join(sorted(options)) or "none"
        raise InvalidArgument(
            f"unknown option(s) in the {parts.scheme}:// URL: {', '.join(unknown)} (known: {known})",
            hint=hint,
        )
    given: dict[str, str] = {}
    for key, value in pairs:
        if key in given:
            raise InvalidArgument(f"option {key} is given twice in the URL", hint=hint)
        given[key] = value
    return BrokerUrl(
        scheme=parts.scheme,
        host=parts.hostname or default_host,
        port=port or default_port,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        path=unquote(parts.path[1:]) if parts.path.startswith("/") else unquote(parts.path),
        options=given,
    )


def flag(value: str | None, name: str, hint: str) -> bool:
    """A yes/no option: 1, true, yes, on, or 0, false, no, off (absent: no)."""
    if value is None:
        return False
    text = value.lower()
    if text in ("1", "true", "yes", "on", ""):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise InvalidArgument(f"option {name} must be true or false, got {value!r}", hint=hint)


def number(value: str | None, name: str, hint: str, *, default: int) -> int:
    if value is None:
        return default
    try:
        found = int(value)
    except ValueError:
        found = -1
    if found < 0:
        raise InvalidArgument(f"option {name} must be a whole number >= 0, got {value!r}", hint=hint)
    return found
