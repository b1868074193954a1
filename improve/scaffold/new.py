"""`improve init --env NAME`: a workspace for a new agent, from the template in `template/`.

The template is a small, working environment of its own domain (a support desk granting account
credits): a machine with two tools, one decision with payloads, a rule as a guard and a sentinel; a
world with an audit; three stand-in models; a generator of plausible cases; twelve labelled scenarios
in both splits; `v0`. Every
file is the template's with the names changed (`support-desk` to NAME, `support_desk` to the
package), so what `init` writes is exactly what the tests run.
"""

from __future__ import annotations

import importlib.util
import json
import keyword
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from improve import DISTRIBUTION
from improve.errors import WorkspaceError
from improve.evals import CONFIG_NAME
from improve.registry import check_slug
from improve.runtime import ENVIRONMENTS
from improve.scaffold.workspace import appended, gitignored, workspace_toml, write_files

TEMPLATE = Path(__file__).parent / "template"
TEMPLATE_NAME = "support-desk"
TEMPLATE_PACKAGE = "support_desk"

PACKAGE_FILES = ("__init__.py", "env.py", "world.py", "models.py", "rules.py", "cases.py", "machine.json")


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


FALLBACK_VERSION = "0.1.0"
"""The version a source tree that was never installed stands for."""


@dataclass(frozen=True)
class ToolkitPin:
    """What the scaffolded workflow installs: exactly the toolkit that wrote the workspace."""

    requirement: str
    """A pip requirement: `improve-agents @ git+URL@COMMIT` for a toolkit installed from a git
    repository (the commit is the pin), else `improve-agents==VERSION` (a release on PyPI)."""
    note: str
    """Where the pin comes from, for the workflow's comment; says when CI cannot install it as is."""


def toolkit_pin() -> ToolkitPin:
    """The pin of the running toolkit, from its installed metadata (PEP 610's direct_url.json)."""
    try:
        dist = distribution(DISTRIBUTION)
    except PackageNotFoundError:  # running from a source tree that was never installed
        return ToolkitPin(
            f"{DISTRIBUTION}=={FALLBACK_VERSION}",
            "this toolkit was not installed: the release of its version",
        )
    release = f"{DISTRIBUTION}=={dist.version}"
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if not isinstance(direct, dict):
        return ToolkitPin(release, "installed from a package index: that release")
    url = _without_credentials(str(direct.get("url", "")))
    vcs = direct.get("vcs_info")
    if (
        isinstance(vcs, dict)
        and vcs.get("vcs") == "git"
        and vcs.get("commit_id")
        and not url.startswith("file:")
    ):
        return ToolkitPin(f"{DISTRIBUTION} @ git+{url}@{vcs['commit_id']}", "installed from git: that commit")
    # The note goes into a file people commit: a path on this machine (a file: URL, a checkout) says
    # nothing to a reader elsewhere and tells everyone where the author keeps things. Only a URL others
    # may reach is named.
    where = url if urlsplit(url).scheme in ("http", "https") else "a local path"
    return ToolkitPin(
        release,
        f"installed from {where}, which a CI runner cannot reach: the release of its version; if that "
        "is not published, install from a git URL pinned to a commit instead",
    )


def _without_credentials(url: str) -> str:
    """`url` without a user or password: a token in a clone URL never goes into a file."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


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
    pin = toolkit_pin()
    workflow = (
        (TEMPLATE / "workflow.yml")
        .read_text(encoding="utf-8")
        .replace("IMPROVE_REQUIREMENT_VALUE", pin.requirement)
        .replace("IMPROVE_REQUIREMENT_NOTE", pin.note)
    )
    files[".github/workflows/improve.yml"] = _renamed(workflow, name, package)
    return files


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
    readme = appended(root / "README.md", section, section.splitlines()[0])
    if readme is not None:
        extended["README.md"] = readme
    extended.update(gitignored(root))
    return write_files(root, new_environment_files(name, package), replace=extended)
