"""Writing workspaces: `improve init --env NAME` for a new agent, `improve init --from NAME` for a
bundled environment's scenarios and policies. Nothing existing is ever overwritten."""

from improve.scaffold.new import init_environment, new_environment_files, package_name
from improve.scaffold.workspace import desk_files, write_desk

__all__ = ["desk_files", "init_environment", "new_environment_files", "package_name", "write_desk"]
