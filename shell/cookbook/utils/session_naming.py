"""`tinker_cookbook.utils.session_naming`: session display names, over `shell.session_names`."""

from __future__ import annotations

from shell.session_names import recipe_session_name, session_display_name, slug

__all__ = ["default_cookbook_session_name", "resolve_session_display_name", "slugify"]

resolve_session_display_name = session_display_name
slugify = slug
default_cookbook_session_name = recipe_session_name
