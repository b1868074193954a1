"""`improve init --env NAME`: a workspace for a new agent, from the template in `template/`.

The template is a small, working environment of its own domain (a support desk granting account
credits): a machine with two tools, one decision with payloads, a rule as a guard and a sentinel; a
world with an audit; three stand-in models; twelve labelled scenarios in both splits; `v0`. Every
file is the template's with the names changed (`support-desk` to NAME, `support_desk` to the
package), so what `init` writes is exactly what the tests run.
"""

from __future__ import annotations

import importlib.util
import keyword
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from improve import DISTRIBUTION
from improve.errors import WorkspaceError
from improve.evals import CONFIG_NAME
from improve.registry import check_slug
from improve.runtime import ENVIRONMENTS
from improve.scaffold.workspace import workspace_toml, write_files

TEMPLATE = Path(__file__).parent / "template"
TEMPLATE_NAME = "support-desk"
TEMPLATE_PACKAGE = "support_desk"

PACKAGE_FILES = ("__init__.py", "env.py", "world.py", "models.py", "rules.py", "machine.json")
GITIGNORE = ("traces/", "reports/", ".improve/")


def package_name(name: str, package: str | None = None, root: Path | None = None) -> str:
    """The Python package of the environment: `support-desk` -> `support_desk`, checked to be a valid
    name that does not shadow a module importable from elsewhere (the standard library, a dependency)."""
    chosen = package or name.replace("-", "_")
    if not chosen.isidentifier() or keyword.iskeyword(chosen):
        raise WorkspaceError(f"{chosen!r} is not a valid Python package name; pass --package NAME")
    spec = importlib.util.find_spec(chosen)
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if spec is not None and not (
        root is not None and origin is not None and origin.is_relative_to(root.resolve())
    ):
        raise WorkspaceError(
            f"a module named {chosen!r} is already importable here, and the environment's package would "
            "shadow it (or be shadowed); pass --package with another name"
        )
    return chosen


def _renamed(text: str, name: str, package: str) -> str:
    return text.replace(TEMPLATE_PACKAGE, package).replace(TEMPLATE_NAME, name)


def _improve_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.1.0"


def new_environment_files(name: str, package: str) -> dict[str, str | Path]:
    """Every file `improve init --env NAME` writes (relative path -> text), README and .gitignore aside."""
    files: dict[str, str | Path] = {
        CONFIG_NAME: workspace_toml(
            name,
            f"# Written by `improve init --env {name}`: the workspace of the {name} agent.",
            module=f"{package}.env:environment",
        )
    }
    for file in PACKAGE_FILES:
        files[f"{package}/{file}"] = _renamed((TEMPLATE / file).read_text(encoding="utf-8"), name, package)
    files[f"scenarios/{name}.yaml"] = _renamed(
        (TEMPLATE / "scenarios.yaml").read_text(encoding="utf-8"), name, package
    )
    for file in ("v0.json", "CHANGELOG.md"):
        text = (TEMPLATE / "policies" / file).read_text(encoding="utf-8")
        files[f"policies/{name}/{file}"] = _renamed(text, name, package)
    workflow = (
        (TEMPLATE / "workflow.yml").read_text(encoding="utf-8").replace("IMPROVE_VERSION", _improve_version())
    )
    files[".github/workflows/improve.yml"] = _renamed(workflow, name, package)
    return files


def _appended(path: Path, text: str, present: str) -> str | None:
    """The file's text with `text` appended, or None when `present` is already in it."""
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    if present in before:
        return None
    separator = "" if not before or before.endswith("\n\n") else ("\n" if before.endswith("\n") else "\n\n")
    return before + separator + text


def init_environment(root: Path, name: str, package: str | None = None) -> list[str]:
    """Scaffold a workspace for a new agent in `root`; the relative paths written or extended.

    Nothing existing is overwritten: when a file it would write exists, nothing is written. The
    README gets a section and `.gitignore` the generated folders, appended to what is there. All or
    nothing (`write_files`): a write that fails leaves `root` as it was.
    """
    check_slug(name, "environment")
    taken = ENVIRONMENTS.sources().get(name)
    if taken is not None:
        # A workspace's [environments.NAME] with the name of one already registered counts it twice:
        # every command in the workspace would refuse to start.
        raise WorkspaceError(
            f"environment {name!r} is already registered ({taken.origin}); choose another name for a new "
            f"agent, or write the bundled one's workspace with `improve init DIR --from {name}`"
        )
    package = package_name(name, package, root)
    section = _renamed((TEMPLATE / "README.md").read_text(encoding="utf-8"), name, package)
    extended: dict[str, str] = {}
    readme = _appended(root / "README.md", section, section.splitlines()[0])
    if readme is not None:
        extended["README.md"] = readme
    ignored = root / ".gitignore"
    existing = ignored.read_text(encoding="utf-8").splitlines() if ignored.exists() else []
    missing = [line for line in GITIGNORE if line not in existing]
    ignore = _appended(ignored, "\n".join(missing) + "\n", "\n".join(missing)) if missing else None
    if ignore is not None:
        extended[".gitignore"] = ignore
    return write_files(root, new_environment_files(name, package), replace=extended)
