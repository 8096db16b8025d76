"""The deliberate differences between pgbroker's schema pgmq and the reference pgmq 1.13 SQL.

This table is the one list of them (docs/compatibility.md explains them for users, in the same
order). Every entry names the test that asserts it, in tests/compat/, so that a difference cannot
hide a real one nor quietly disappear; ``test_every_deliberate_difference_is_asserted``
(test_failures.py) checks that each test exists. Only D15 (an error's CONTEXT lines) is visible
to pgmq's own regression tests (pgmq-extension/test/sql/*.sql); the others need arguments, names
or calls those tests never make.
"""

from __future__ import annotations

from typing import NamedTuple


class Difference(NamedTuple):
    """One deliberate difference: what pgbroker does, what pgmq does, and why."""

    pgbroker: str
    pgmq: str
    reason: str
    tests: tuple[str, ...]


DELIBERATE_DIFFERENCES: dict[str, Difference] = {
    "D1b": Difference(
        pgbroker="create refuses names pgmq accepts: empty, with control characters, longer than "
        "47 bytes in UTF-8, or (partitioned) with a period; PB001 (InvalidQueueName).",
        pgmq="Creates them (its tables' names are then truncated or unusable by pg_partman).",
        reason="Such a queue cannot be used safely; pgmq's own checks (characters, then length, "
        "then a NULL name) come first, with pgmq's errors.",
        tests=("test_differential.py::test_deliberate_bad_queue_names_are_rejected",),
    ),
    "D2": Difference(
        pgbroker="A name differing from an existing queue's only in case is refused with PB004 "
        "(QueueNameConflict); every function finds a queue whatever the case of the name given "
        "(bind_topic('JOBS', ...) binds queue 'jobs').",
        pgmq="Registers both names over the same tables; functions that look meta up compare "
        "names exactly ('Queue \"JOBS\" does not exist').",
        reason="spec/pgmq-api.md: names differing only in case map to the same tables, a trap not to repeat.",
        tests=(
            "test_differential.py::test_deliberate_case_conflict_is_rejected",
            "test_failures.py::test_deliberate_names_are_found_in_any_case",
        ),
    ),
    "D4": Difference(
        pgbroker="list_queues and metrics_all return queues ordered by name.",
        pgmq="pgmq.meta's physical order.",
        reason="A stable order; pgmq does not promise one.",
        tests=("test_differential.py::test_deliberate_list_queues_ordered_by_name",),
    ),
    "D5": Difference(
        pgbroker="read, pop and set_vt return rows in msg_id order.",
        pgmq="UPDATE/DELETE ... RETURNING order, unspecified.",
        reason="A stable order; the rows are the same.",
        tests=("test_differential.py::test_read_visibility_and_qty",),
    ),
    "D6": Difference(
        pgbroker="A message sent without delay has vt = enqueued_at.",
        pgmq="vt = clock_timestamp() of the insert.",
        reason="It is what puts the message in pgbroker's ready index (reads that do not slow "
        "down with the backlog). Timestamps are not part of the comparison (two clocks).",
        tests=("test_differential.py::test_deliberate_vt_equals_enqueued_at_without_delay",),
    ),
    "D10": Difference(
        pgbroker="Notify on insert works for mixed-case queue names, on the channel of the name as given "
        '("pgmq.q_Orders.INSERT"), as in pgmq 1.13.1.',
        pgmq="1.13.0 (the reference SQL here): its trigger never fires for them.",
        reason="A weakness spec/pgmq-api.md says not to copy; pgmq 1.13.1 fixed it the same way.",
        tests=("test_differential.py::test_deliberate_notify_works_for_mixed_case_queue_names",),
    ),
    "D11": Difference(
        pgbroker="create_partitioned of an existing partitioned queue does nothing (idempotent, "
        "like create); of an existing plain queue, and with bad partition or retention intervals, "
        "it fails up front with PB007.",
        pgmq="Fails inside pg_partman, with pg_partman's message (which varies with its version).",
        reason="pgmq's failure there is pg_partman's internal text, not a contract; create is "
        "idempotent everywhere else.",
        tests=("test_failures.py::test_deliberate_partitioned_create_is_idempotent",),
    ),
    "D12": Difference(
        pgbroker="convert_archive_partitioned converts the archive of any queue, names with "
        "capitals or '-' included, and moves the archived rows into the partitions.",
        pgmq="Renames the archive's index through an unquoted identifier, so it fails for such "
        "names (42P01 or a syntax error); it leaves the archived rows behind in a_<name>_old. "
        "Its notices, and its failure for a 47-character name, are given the same.",
        reason="pgmq's failure is a quoting bug and its lost rows an omission, not a contract.",
        tests=("test_failures.py::test_deliberate_convert_archive_of_mixed_case_queue",),
    ),
    "D13": Difference(
        pgbroker="The *_with_poll forms read at least once, also with max_poll_seconds = 0 (and so "
        "fail on a queue that does not exist).",
        pgmq="Return nothing, without reading, when max_poll_seconds is 0.",
        reason="One code path for every poll; a zero wait is a plain read, not a no-op.",
        tests=("test_failures.py::test_deliberate_grouped_poll_reads_once_without_waiting",),
    ),
    "D14": Difference(
        pgbroker="Errors pgmq does not have keep their class PB code: a message too large "
        "(PB005), a queue full (PB006), pgbroker's policies.",
        pgmq="Has no such limits.",
        reason="They exist only with pgbroker's extensions (max_message_bytes, policies).",
        tests=("test_failures.py::test_deliberate_errors_pgmq_does_not_have_keep_pb_codes",),
    ),
    "D15": Difference(
        pgbroker="An error's CONTEXT (the PL/pgSQL call stack psql prints under it) names "
        "pgbroker's functions and lines; psql also prints the DETAIL and HINT pgbroker adds "
        "(its code, 'pgbroker PB001: ...', and how to fix it).",
        pgmq="Names pgmq's: 'PL/pgSQL function pgmq.validate_queue_name(text) line 8 at RAISE', ...; "
        "no DETAIL or HINT.",
        reason="The call stack is the implementation, not the contract: matching base.sql's two "
        "blocks (create and create_partitioned of a 48-character name) would mean laying pgbroker's "
        "functions out line for line as pgmq's, and dropping the DETAIL that carries pgbroker's "
        "code, which its client maps to typed errors. Clients see the SQLSTATE and the message, "
        "which are pgmq's. This one is visible to pgmq's regression tests: base.sql prints CONTEXT "
        "for its first two errors (it sets SHOW_CONTEXT never only further down).",
        tests=("test_failures.py::test_deliberate_error_context_is_pgbrokers",),
    ),
}
