"""Build hook: the synchronous client is generated from the asyncio one while the package builds.

src/pgbroker/queues/_client_async.py is the one written copy of the client; scripts/async_to_sync.py turns it into
src/pgbroker/queues/_client.py, which git does not keep. Running the generator inside build_py makes every
way of installing pgbroker (a wheel, `pip install .`, an editable install) carry a client.py that
matches the aio.py it was built from. Everything else about the build is in pyproject.toml.
"""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithSyncClient(build_py):
    def run(self) -> None:
        generator = ROOT / "scripts" / "async_to_sync.py"
        if generator.exists():  # absent only when building from a tree that already holds its output
            sys.path.insert(0, str(ROOT))
            from scripts.async_to_sync import main as generate_sync_twins

            generate_sync_twins([])
        super().run()


setup(cmdclass={"build_py": BuildPyWithSyncClient})
