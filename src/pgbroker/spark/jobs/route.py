"""Job ``route``: messages from one queue, transformed, into another queue, exactly once.

    pgbroker pipeline route orders billing --checkpoint /ckpt/o2b --function rules:to_invoice
    pgbroker pipeline route orders eu --checkpoint /ckpt/o2eu \
        --where "get_json_object(message, '$.region') = 'eu'"

The transformation is a Python function (--function module:function, see
pgbroker.spark.jobs.transform) or a SQL expression giving the new message (--sql); --where keeps
only the messages matching a SQL condition; with neither, messages are copied unchanged. Headers
are carried over. The target queue's writer records each partition of each micro-batch with the
messages it sends, and the source releases a batch only once Spark committed it: killed and
restarted from its checkpoint, the job sends every message exactly once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pgbroker.errors import InvalidArgument
from pgbroker.spark.jobs import common, restarts, transform

PROG = "pgbroker pipeline route"
DESCRIPTION = "Route a queue's messages through a transformation into another queue, exactly once."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help="the queue to read")
    parser.add_argument("target", metavar="TARGET", help="the queue to send to")
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--function",
        metavar="MODULE:FUNCTION",
        help="a Python function: takes a message (decoded JSON), returns the new one or None to drop it",
    )
    how.add_argument("--sql", metavar="EXPR", help="a Spark SQL expression computing the new message")
    parser.add_argument("--where", metavar="CONDITION", help="keep only messages matching this SQL condition")
    common.add_stream_arguments(parser, checkpoint_required=True)
    common.add_spark_arguments(parser)


def run(args: argparse.Namespace) -> int:
    common.check_requirements()
    if args.function:
        transform.load_function(args.function)
    dsn = common.database(args)
    common.check_queue(dsn, args.source)
    common.check_queue(dsn, args.target)
    if args.source.lower() == args.target.lower():
        raise InvalidArgument(
            f"source and target are the same queue {args.source!r}: every message would come back forever"
        )
    checkpoint = args.checkpoint.resolve()
    spark = common.start_spark(args, f"pgbroker route {args.source} -> {args.target}")
    messages = common.read_stream(
        spark, args, dsn, args.source, consumer=f"route:{args.source}:{args.target}"
    )
    if args.where:
        messages = transform.apply_where(messages, args.where)
    if args.function:
        transform.ship_module(spark, args.function)
        routed = transform.apply_function(messages, args.function)
    elif args.sql:
        routed = transform.apply_sql(messages, args.sql)
    else:
        routed = messages.select("message", "headers")
    writer = (
        routed.writeStream.format("pgbroker")
        .option("queue", args.target)
        .option("dsn", dsn)
        .option("checkpointLocation", str(checkpoint))
        .queryName(f"route {args.source} to {args.target}")
    )
    print(f"route: {args.source} -> {args.target} (checkpoint {checkpoint})", flush=True)
    restarts.watch_restarting(lambda: common.trigger(writer, args).start(), "route", dsn)
    return common.EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return common.job_main(run, add_arguments, PROG, DESCRIPTION, argv)


if __name__ == "__main__":
    sys.exit(main())
