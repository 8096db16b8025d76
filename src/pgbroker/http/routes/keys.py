"""The calling key, as the server sees it (the dashboard shows what it may do)."""

from __future__ import annotations

from pgbroker.http.models import KeyInfo
from pgbroker.http.operations import Call, Router

router = Router()


@router.get("/v1/key", "the calling key: its name, scopes, queue and group patterns")
async def whoami(call: Call) -> KeyInfo:
    key = call.caller
    return KeyInfo(name=key.name, scopes=sorted(key.scopes), queues=list(key.queues), groups=list(key.groups))
