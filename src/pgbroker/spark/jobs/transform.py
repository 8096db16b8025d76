"""The transformations of the ``route`` job: a Python function applied to each message, or a SQL
expression computing the new message.

A function is named ``module:function``; it takes a message (the decoded JSON) and returns the
new message (any JSON value) or None to drop it; headers pass through. It runs on the executors,
so its module is imported there: a module that is not installed site-wide is shipped with the
job. It must be deterministic (same input, same output): a batch replayed after a crash must
produce what its first run produced, or exactly-once has nothing to hold on to.
"""

from __future__ import annotations

import importlib
import importlib.util
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pgbroker.errors import InvalidArgument


def load_function(ref: str) -> Callable[[Any], Any]:
    """The callable named by ``module:function`` (imported here, on the driver, to fail early)."""
    module_name, sep, name = ref.partition(":")
    if not sep or not module_name or not name:
        raise InvalidArgument(
            f"--function must be module:function, got {ref!r}",
            hint="For example --function mypkg.rules:enrich",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(
            f"cannot import module {module_name!r} for --function: {exc}",
            hint="Run from the directory that holds it, or set PYTHONPATH.",
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise InvalidArgument(f"{ref!r}: module {module_name!r} has no function {name!r}")
    return function  # type: ignore[no-any-return]


def ship_module(spark: Any, ref: str) -> Path | None:
    """Add the function's top-level module or package to the executors' path, unless installed."""
    top = ref.partition(":")[0].split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None or spec.origin in ("built-in", "frozen"):
        return None
    origin = Path(spec.origin).resolve()
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    if any(parent in installed for parent in origin.parents):
        return None
    if origin.name == "__init__.py":
        package = origin.parent
        target = Path(tempfile.mkdtemp(prefix="pgbroker-route-")) / f"{top}.zip"
        with zipfile.ZipFile(target, "w") as archive:
            for path in sorted(package.rglob("*.py")):
                archive.write(path, Path(top) / path.relative_to(package))
    else:
        target = origin
    spark.sparkContext.addPyFile(str(target))
    return target


def apply_function(df: Any, ref: str) -> Any:
    """df (message, headers) with ``ref`` applied to every message, on the executors.

    A plain Python UDF (not mapInArrow or a pandas UDF, which would need pandas on every
    executor); a message the function drops comes out NULL and is filtered away.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    module_name, _, name = ref.partition(":")
    loaded: list[Callable[[Any], Any]] = []

    # Nested so that it travels by value; it imports the user's module where it runs, once per
    # Python worker.
    def route(message: str) -> str | None:
        import json

        if not loaded:
            loaded.append(getattr(importlib.import_module(module_name), name))
        result = loaded[0](json.loads(message))
        return None if result is None else json.dumps(result, separators=(",", ":"), allow_nan=False)

    routed = F.udf(route, StringType(), useArrow=False)
    return df.select(routed("message").alias("message"), "headers").where("message IS NOT NULL")


def apply_sql(df: Any, expression: str) -> Any:
    """df (message, headers) with the message replaced by a SQL expression over the source's
    columns; a result that is not text (a struct, a map) is turned into JSON with to_json."""
    from pyspark.errors import AnalysisException, ParseException
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    try:
        computed = df.select(F.expr(expression).alias("message"), "headers")
        kind = computed.schema["message"].dataType
    except (AnalysisException, ParseException) as exc:
        raise InvalidArgument(
            f"--sql {expression!r}: {_first_line(exc)}",
            hint="The expression sees the columns msg_id, read_ct, enqueued_at, message and headers "
            "(message and headers are JSON text: get_json_object(message, '$.id') reads a field).",
        ) from None
    if isinstance(kind, StringType):
        return computed
    return computed.select(F.to_json("message").alias("message"), "headers")


def apply_where(df: Any, condition: str) -> Any:
    from pyspark.errors import AnalysisException, ParseException

    try:
        filtered = df.where(condition)
        filtered.schema  # noqa: B018 (analyses the condition now, not when the stream starts)
    except (AnalysisException, ParseException) as exc:
        raise InvalidArgument(f"--where {condition!r}: {_first_line(exc)}") from None
    return filtered


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
