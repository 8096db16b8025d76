"""Where things are: the repository's root, the working directory of the processes tests start."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
