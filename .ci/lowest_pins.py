"""Print a pip constraints file that pins every runtime dependency to the lowest version pyproject.toml
allows (`name>=X` becomes `name==X`), for `make test-lowest`: the suite at the bottom of the pins."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
for requirement in project["dependencies"]:
    name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
    lowest = re.search(r">=\s*([0-9][^,;\s]*)", requirement)
    if lowest is None:
        sys.exit(f"{requirement!r} has no lower bound: pin one (>=X) so the lowest version can be tested")
    print(f"{name}=={lowest[1]}")
