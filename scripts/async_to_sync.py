"""Generate the synchronous client from the asyncio one: the async source is the only written copy.

    python scripts/async_to_sync.py          # rewrite every generated file (what `make generate` runs)
    python scripts/async_to_sync.py --check  # exit 1, naming the stale files, when one would change

The generated files are committed, each opening with a "generated, do not edit" header, so that
review, search and jump-to-definition see the classes users import. `make lint` and `make test` run
`--check` first, and tests/tree/test_generated_sync.py fails too, while a twin is stale: the
repository holds each method once by hand, and its twin can never drift from it.

Why tokens and not an ``ast`` round trip: ``ast.unparse`` throws away comments, blank lines and
the layout of every long call, and the generated twin is read and reviewed like hand-written code.
So the source is rewritten in place, token by token (``tokenize`` sees ``async``, ``await`` and
names as tokens, and comments and strings as single tokens that a rename can be applied to), and
``ast`` is used only to find the line ranges of the marked blocks. Every line of the output is a
line of the source with words taken out or renamed, so a diff between the two reads as the list of
the differences and nothing else.

The rewrite, in order:
- ``if ASYNC:`` blocks are dropped, and the ``else:`` branch of one, if any, is kept dedented;
  the ``ASYNC = True`` line that makes the source run is dropped too;
- a line ending in a ``# sync: <code>`` comment becomes ``<code>`` (same indentation);
- ``async def``/``async with``/``async for`` lose ``async``, ``await`` goes;
- names are renamed (AsyncBroker -> Broker, AsyncConnectionPool -> ConnectionPool, ...), in code
  and, whole words only, in docstrings and comments; ``asyncio.sleep`` becomes ``time.sleep``;
  any other use of asyncio stops the generator (mark it ``if ASYNC:``);
- names imported on one ``from ... import`` line are sorted again (a rename can unsort them);
- the comment lines before the module docstring become a "generated, do not edit" header.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    source: str  # the asyncio module, relative to ROOT
    generated: str  # where its sync twin goes


TARGETS = (
    Target("src/pgbroker/queues/_client_async.py", "src/pgbroker/queues/_client.py"),
    Target("src/pgbroker/streams/_client_async.py", "src/pgbroker/streams/_client.py"),
    Target("src/pgbroker/_db/listen_async.py", "src/pgbroker/_db/listen.py"),
    Target("src/pgbroker/_db/install_async.py", "src/pgbroker/_db/install.py"),
)

COMMAND = "python scripts/async_to_sync.py (or: make generate)"

NAMES = {
    "AsyncBroker": "Broker",
    "AsyncStream": "Stream",
    "AsyncStreamConsumer": "StreamConsumer",
    "AsyncQueue": "Queue",
    "AsyncTransaction": "Transaction",
    "AsyncExecutor": "Executor",
    "AsyncPoolExecutor": "PoolExecutor",
    "AsyncConnectionExecutor": "ConnectionExecutor",
    "AsyncListener": "Listener",
    "AsyncSubscription": "Subscription",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncConnection": "Connection",
    "AsyncIterator": "Iterator",
    "AsyncGenerator": "Generator",
    "asynccontextmanager": "contextmanager",
    "install_async": "install",
    "listen_async": "listen",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
}
# asyncio's functions that have a sync equivalent, and the module `import asyncio` becomes.
ASYNCIO_FUNCTIONS = {"sleep": "time.sleep"}
ASYNCIO_IMPORT = "time"
# Words of prose (docstrings, comments) beyond the names above.
PROSE = {"async with": "with", "async for": "for", "asyncio client": "synchronous client"}

_WORDS = re.compile(
    "|".join(
        [rf"\b{re.escape(name)}\b" for name in sorted(NAMES, key=len, reverse=True)]
        + [rf"\b{re.escape(words)}\b" for words in PROSE]
    )
)
_FROM_IMPORT = re.compile(r"^from (\S+) import ([\w, ]+)$")
_SYNC_COMMENT = "# sync:"
_INDENT = "    "


def header(target: Target) -> str:
    return (
        f"# Generated from {Path(target.source).name} by scripts/async_to_sync.py; do not edit.\n"
        f"# Change {target.source}, then run `make generate` (python scripts/async_to_sync.py).\n"
    )


def _drop_marked_blocks(source: str) -> list[str]:
    """Lines of ``source`` without the ``if ASYNC:`` blocks (else branches dedented) and the flag."""
    lines = source.splitlines(keepends=True)
    keep = [True] * len(lines)
    dedent: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and _is_async_flag(node):
            first = node.lineno - 1
            while first > 0 and lines[first - 1].lstrip().startswith("#"):
                first -= 1  # the flag's comment goes with it
            _blank_out(keep, lines, first, _block_end(lines, node))
        elif isinstance(node, ast.If) and _is_async_marker(node):
            if not node.orelse:
                _blank_out(keep, lines, node.lineno - 1, _block_end(lines, node))
                continue
            # Drop from `if ASYNC:` through the `else:` line; keep the else body, dedented.
            else_line = node.orelse[0].lineno - 2
            while lines[else_line].split("#")[0].strip() != "else:":
                if lines[else_line].lstrip().startswith("elif") or else_line <= node.lineno:
                    raise SystemExit(f"line {node.lineno}: `if ASYNC:` takes an else, not an elif")
                else_line -= 1
            _blank_out(keep, lines, node.lineno - 1, else_line + 1)
            dedent.update(range(else_line + 1, _block_end(lines, node)))
    out = []
    for i, line in enumerate(lines):
        if keep[i]:
            out.append(line.removeprefix(_INDENT) if i in dedent else line)
    return out


def _is_async_marker(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "ASYNC"


def _is_async_flag(node: ast.Assign) -> bool:
    return len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "ASYNC"


def _block_end(lines: list[str], node: ast.stmt) -> int:
    """The index of the line after ``node``, its trailing comments (indented deeper) included."""
    end = node.end_lineno or node.lineno
    indent = len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())
    while end < len(lines):
        line = lines[end]
        if not line.lstrip().startswith("#") or len(line) - len(line.lstrip()) <= indent:
            break
        end += 1
    return end


def _blank_out(keep: list[bool], lines: list[str], start: int, end: int) -> None:
    """Drop lines[start:end]; where that leaves a blank line on either side, drop one of them."""
    for i in range(start, end):
        keep[i] = False
    before = next((i for i in range(start - 1, -1, -1) if keep[i]), None)
    after = next((i for i in range(end, len(lines)) if keep[i]), None)
    if before is not None and after is not None and not lines[before].strip() and not lines[after].strip():
        keep[before] = False


def _apply_sync_comments(text: str) -> str:
    """A line ending in ``# sync: <code>`` becomes ``<code>``, at the line's indentation."""
    lines = text.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and tok.string.startswith(_SYNC_COMMENT):
            row = tok.start[0] - 1
            line = lines[row]
            indent = line[: len(line) - len(line.lstrip())]
            lines[row] = indent + tok.string.removeprefix(_SYNC_COMMENT).strip() + "\n"
    return "".join(lines)


def _rename_words(text: str) -> str:
    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        return NAMES.get(word) or PROSE[word]

    return _WORDS.sub(swap, text)


def _rewrite_tokens(text: str) -> str:
    """Drop async/await, rename names, and rename words in strings and comments."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    edits: list[tuple[int, int, str]] = []
    for i, tok in enumerate(tokens):
        after = tokens[i + 1] if i + 1 < len(tokens) else tok
        keyword = tok.string if tok.type == tokenize.NAME else ""
        if keyword == "await" or (keyword == "async" and after.string in ("def", "with", "for")):
            edits.append((offset(tok.start), offset(after.start), ""))  # the word and the space after it
        elif keyword == "asyncio":
            edits.append(_asyncio_edit(tokens, i, offset))
        elif keyword in NAMES:
            edits.append((offset(tok.start), offset(tok.end), NAMES[tok.string]))
        elif tok.type in (tokenize.STRING, tokenize.COMMENT):
            renamed = _rename_words(tok.string)
            if renamed != tok.string:
                edits.append((offset(tok.start), offset(tok.end), renamed))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _asyncio_edit(
    tokens: list[tokenize.TokenInfo], i: int, offset: Callable[[tuple[int, int]], int]
) -> tuple[int, int, str]:
    """``import asyncio`` and ``asyncio.sleep`` have a sync form; anything else of asyncio is an error."""
    tok = tokens[i]
    if i and tokens[i - 1].string == "import":
        return offset(tok.start), offset(tok.end), ASYNCIO_IMPORT
    if i + 2 < len(tokens) and tokens[i + 1].string == "." and tokens[i + 2].string in ASYNCIO_FUNCTIONS:
        return offset(tok.start), offset(tokens[i + 2].end), ASYNCIO_FUNCTIONS[tokens[i + 2].string]
    raise SystemExit(
        f"line {tok.start[0]}: asyncio has no sync equivalent here ({tok.line.strip()!r}): "
        "put it in an `if ASYNC:` block, or end the line with `# sync: <code>`"
    )


def _import_order(name: str) -> tuple[int, str]:
    """Ruff's isort order of the names of one import: CONSTANTS, Classes, then the rest."""
    if name.isupper() and len(name) > 1:
        return 0, name
    return (1 if name[:1].isupper() else 2), name


def _sort_imports(text: str) -> str:
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        found = _FROM_IMPORT.match(line.rstrip("\n"))
        if found:
            names = sorted({n.strip() for n in found.group(2).split(",")}, key=_import_order)
            lines[i] = f"from {found.group(1)} import {', '.join(names)}\n"
    return "".join(lines)


def _replace_header(text: str, target: Target) -> str:
    lines = text.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    return header(target) + "".join(lines[first:])


def generate(source: str, target: Target) -> str:
    """The sync twin of the asyncio module ``source``."""
    text = "".join(_drop_marked_blocks(source))
    text = _apply_sync_comments(text)
    text = _rewrite_tokens(text)
    text = _sort_imports(text)
    text = _replace_header(text, target)
    _check_sync(text, target)
    return text


def _check_sync(text: str, target: Target) -> None:
    """The output must be Python without anything async or any marker left in it."""
    tree = ast.parse(text, target.generated)
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef | ast.AsyncWith | ast.AsyncFor | ast.Await):
            raise SystemExit(f"{target.generated}:{node.lineno}: still async after the rewrite")
        if isinstance(node, ast.Name) and node.id == "ASYNC":
            raise SystemExit(f"{target.generated}:{node.lineno}: ASYNC is left: only `if ASYNC:` is a marker")


def stale() -> dict[Target, str]:
    """The targets whose generated file is missing or out of date, with what it should hold."""
    out = {}
    for target in TARGETS:
        wanted = generate((ROOT / target.source).read_text(), target)
        path = ROOT / target.generated
        if not path.exists() or path.read_text() != wanted:
            out[target] = wanted
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    behind = stale()
    for target, wanted in behind.items():
        if args.check:
            print(f"{target.generated} is stale: run {COMMAND}", file=sys.stderr)
        else:
            (ROOT / target.generated).write_text(wanted)
            print(f"wrote {target.generated}")
    return 1 if args.check and behind else 0


if __name__ == "__main__":
    sys.exit(main())
