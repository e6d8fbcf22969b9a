"""Where the loaders look for the real data files (never downloaded)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeAlias

#: where a loader looks: a file, its folder, or a folder holding the data set's folder;
#: ``None``: ``$FEDSTATS_DATA``
DataPath: TypeAlias = "str | os.PathLike[str] | None"


def find_data_file(path: DataPath, filename: str, folder: str) -> Path:
    """``filename`` under ``path`` (the file itself, its folder, or a folder holding
    ``folder/``), or with ``path=None`` under ``$FEDSTATS_DATA/folder`` or ``$FEDSTATS_DATA``."""
    if path is None:
        root = os.environ.get("FEDSTATS_DATA")
        if not root:
            raise FileNotFoundError(
                f"{filename} not found: pass path= (the folder holding it) or set "
                f"FEDSTATS_DATA to a folder with a {folder}/ sub-folder"
            )
        candidates = [Path(root) / folder / filename, Path(root) / filename]
    else:
        p = Path(path)
        candidates = [p] if p.is_file() else [p / filename, p / folder / filename]
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(f"{filename} not found; looked at: {', '.join(str(c) for c in candidates)}")
