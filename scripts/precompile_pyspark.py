"""Put compiled bytecode into pyspark's own pyspark.zip, so that the Python processes Spark
starts import it without compiling it first.

Spark starts a Python process for each Python data source's planner and streaming source, and
puts $SPARK_HOME/python/lib/pyspark.zip ahead of site-packages on its PYTHONPATH. A zip holds
no __pycache__, so every such process compiled the pyspark modules it imports: 0.8-1.4 s of CPU
before it connects back to the JVM, which waits 10 s at most (a constant in Spark's
PythonWorkerFactory, not a setting). On a loaded machine (load average 10-17 on 2 cores) the
wait ran out and the query failed ("Python worker failed to connect back"). With .pyc files
beside the sources in the zip (the layout zipimport reads), the import takes 0.35-0.55 s.

Idempotent: a zip that already holds .pyc files is left as it is. Without pyspark, nothing to do.
Run with the interpreter Spark's workers use (the bytecode is that version's):
``python scripts/precompile_pyspark.py``.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path


def pyspark_zip() -> Path | None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "python" / "lib" / "pyspark.zip"
    return path if path.is_file() else None


def precompile(archive: Path) -> bool:
    """Rewrite ``archive`` with a .pyc beside each .py; False when it had them already."""
    with zipfile.ZipFile(archive) as source:
        if any(name.endswith(".pyc") for name in source.namelist()):
            return False
        with tempfile.TemporaryDirectory() as scratch:
            tree = Path(scratch) / "tree"
            source.extractall(tree)
            # legacy=True: foo.pyc next to foo.py, where zipimport looks (it ignores __pycache__).
            with warnings.catch_warnings():  # pyspark's own tests hold a literal compared with "is"
                warnings.simplefilter("ignore", SyntaxWarning)
                compileall.compile_dir(tree, quiet=2, legacy=True)
            rebuilt = archive.with_suffix(".zip.new")
            with zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as target:
                for file in sorted(tree.rglob("*")):
                    if file.is_file():
                        target.write(file, file.relative_to(tree).as_posix())
    os.replace(rebuilt, archive)
    return True


def main() -> int:
    archive = pyspark_zip()
    if archive is None:
        print("precompile_pyspark: pyspark is not installed here; nothing to do")
        return 0
    if precompile(archive):
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        print(f"precompile_pyspark: compiled {archive} for Python {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
