"""`tinker_cookbook.utils.git_rev`: a recipe's service metadata, over `shell.run_metadata`.

Deliberate difference: `git_rev` holds this project's installed version (the code that runs),
where the cookbook writes its own version.
"""

from __future__ import annotations

from shell.run_metadata import recipe_metadata

__all__ = ["recipe_user_metadata"]


def recipe_user_metadata(recipe_name: str) -> dict[str, str]:
    """`{"recipe_name": recipe_name, "git_rev": <this project's version>}`, the `user_metadata`
    of a recipe's `ServiceClient`."""
    return recipe_metadata(recipe_name)
