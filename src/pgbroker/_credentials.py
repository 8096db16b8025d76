"""Passwords kept out of what pgbroker says about a DSN or a broker URL it could not use.

libpq and urllib quote the part of a DSN or URL they stumble on, and a password with a character
the URL form reserves (%, /, #, ?, @) written unencoded is what they stumble on:
``postgresql://app:pa/ss@db/app`` makes libpq read ``pa`` as the port, ``invalid integer value
"pa" for connection option "port"``; ``s3cr%et`` makes ``invalid percent-encoded token:
"s3cr%et"``. Such a message goes to the terminal, a service's log and its JSON lines:
:func:`hide_passwords` takes the password out of it first, whole or in the pieces quoted.
"""

from __future__ import annotations

import re

__all__ = ["hide_passwords", "safe_cause"]

HIDDEN = "***"
# The userinfo of a URL: after the scheme, up to the last @ before the query (a password with an
# unencoded / or @ still ends there); the password follows the user's first colon.
_URL_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^:@]*:([^?]*)@")
# password=... (and sslpassword=..., a client key's passphrase) of key=value pairs, up to the next
# keyword= (an unquoted value with a space runs on past it), and of a URL's query string.
_PAIR_PASSWORD = re.compile(r"(?:^|\s)(?:ssl)?password\s*=\s*(.*?)(?=\s+\w+\s*=|\s*$)", re.DOTALL)
_QUERY_PASSWORD = re.compile(r"[?&](?:ssl)?password=([^&]*)")
# What libpq ("...") and urllib ('...') quote of the text they could not parse.
_QUOTED = re.compile(r"\"([^\"]*)\"|'([^']*)'")


def _passwords(dsn: str) -> list[str]:
    found = [
        m[1] for pattern in (_URL_PASSWORD, _PAIR_PASSWORD, _QUERY_PASSWORD) for m in pattern.finditer(dsn)
    ]
    return [p for p in found if p]


def hide_passwords(text: str, dsn: str) -> str:
    """``text`` (a message about ``dsn``, a DSN or a broker URL) with every password of ``dsn``
    replaced by ***, and every quoted piece that is part of one: what libpq or urllib quote of a
    password it misread is a piece of it."""
    passwords = _passwords(dsn)
    if not passwords:
        return text

    def quoted(match: re.Match[str]) -> str:
        piece = match[1] if match[1] is not None else match[2]
        if piece and any(piece in password for password in passwords):
            return match[0][0] + HIDDEN + match[0][0]
        return match[0]

    hidden = _QUOTED.sub(quoted, text)
    for password in sorted(passwords, key=len, reverse=True):
        hidden = hidden.replace(password, HIDDEN)
    return hidden


def safe_cause(cause: BaseException, dsn: str) -> BaseException | None:
    """``cause``, to chain an error about ``dsn`` to, or None when its text says a password of
    ``dsn`` (a piece libpq or urllib quoted of one it misread), which -v's traceback would print.
    A cause kept is what callers judge a failure by (pgbroker._db.refusals.passes: a server out of
    reach, or starting, is waited for; a replacement worker process waits for a refused login)."""
    return cause if hide_passwords(str(cause), dsn) == str(cause) else None
