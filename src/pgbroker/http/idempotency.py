"""The Idempotency-Key request header of the send operations (queues and streams): what they
declare for the OpenAPI spec, the refusal it may bring, and whose keys they are. The engine keeps
the keys (pgbroker.send_idempotent, pgbroker.stream_send_idempotent)."""

from __future__ import annotations

from pgbroker._db.api_keys import ApiKey

IDEMPOTENCY_KEY = "Idempotency-Key"

SEND_HEADERS = {
    IDEMPOTENCY_KEY: "1 to 255 characters, the API key's own: the same request again with this key "
    "within 24 hours answers the first one's ids and sends nothing; another request with it is "
    "refused (422 idempotency_key_reused). Retry with it after a 503 outcome_unknown or a lost "
    "answer. Another API key's Idempotency-Key of the same text is another key.",
}

IDEMPOTENCY_ERRORS = {
    422: "idempotency_key_reused (the Idempotency-Key came before with another request)",
    503: "outcome_unknown (the connection to the database broke while the send committed: it may "
    "be stored; retry with the same Idempotency-Key) or database error",
}


def idempotency_scope(key: ApiKey | None) -> str | None:
    """The scope of a request's Idempotency-Key: its API key's, so that one key's Idempotency-Key
    neither answers nor refuses another's send (two producers naming requests after the same order
    ids, say). Without keys (a server that asks for none), the queue's senders without a scope."""
    return None if key is None else f"api key {key.id}"
