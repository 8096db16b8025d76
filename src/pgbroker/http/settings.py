"""The server's settings: limits and knobs of ``pgbroker serve``. The request models read the
limits from them when they validate (pgbroker.http.validation.Limit), and the OpenAPI spec is written
with the same values, so a client sees the bounds the server enforces."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """Limits and knobs of the server; the defaults suit a small deployment."""

    max_body_bytes: int = 1024 * 1024
    body_timeout_seconds: float = 30.0  # for the whole body of a request to arrive
    max_batch: int = 1000  # messages per send, read or ack
    max_wait_seconds: float = 20.0  # long-poll cap: a proxy's idle timeout is often 30 s or more
    # A request's database calls unanswered this long past its own long-poll wait are given up
    # (503 database_unavailable, the connection closed): a hung server or a stuck pooler.
    answer_within_seconds: float = 30.0
    rate_per_second: float = 100.0  # per key, unless the key sets its own
    rate_burst: float = 200.0
    key_cache_seconds: float = 5.0  # how long a revoked key may still be honoured
    # Failed API keys per client address: past them, keys not cached are refused unread (429).
    auth_failures_per_second: float = 1.0
    auth_failure_burst: float = 20.0
    max_concurrency: int = 256  # requests handled at once; more are answered 503 at once
    # Requests of one key at once (None: half of max_concurrency); more are answered 429 at once.
    # One key holding every slot with long polls locked every other key out.
    max_concurrency_per_key: int | None = None
    metrics_public: bool = False  # /metrics without a key (for a scraper on a private network)
    stats_exact_below: int = 10_000  # counts past this are estimated (pgbroker.queue_stats)
    # The dashboard's history (pgbroker.http.monitoring): sampled this often, kept this long (0: off).
    history_interval_seconds: float = 10.0
    history_retention_seconds: float = 24 * 3600.0

    @property
    def key_concurrency(self) -> int:
        """The requests one key may have in hand at once."""
        return self.max_concurrency_per_key or max(1, self.max_concurrency // 2)

    @property
    def reserved_slots(self) -> int:
        """The last of the max_concurrency slots, each kept for a key with no request in hand: two
        keys at their share held every slot. To lock a key out, this many other keys must hold one."""
        return self.max_concurrency // 4
