"""The Idempotency-Key request header of the send operations (queues and streams): what they
declare for the OpenAPI spec, and the refusal it may bring. The engine keeps the keys
(pgbroker.send_idempotent, pgbroker.stream_send_idempotent)."""

from __future__ import annotations

IDEMPOTENCY_KEY = "Idempotency-Key"

SEND_HEADERS = {
    IDEMPOTENCY_KEY: "1 to 255 characters: the same request again with this key within 24 hours "
    "answers the first one's ids and sends nothing; another request with it is refused "
    "(422 idempotency_key_reused). Retry with it after a 503 outcome_unknown or a lost answer.",
}

IDEMPOTENCY_ERRORS = {
    422: "idempotency_key_reused (the Idempotency-Key came before with another request)",
    503: "outcome_unknown (the connection to the database broke while the send committed: it may "
    "be stored; retry with the same Idempotency-Key) or database error",
}
