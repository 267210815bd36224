"""Display names of a recipe's Tinker session (tinker-cookbook 0.6.1's `utils/session_naming`).

Conventions:
- A session's display name shows in the Tinker console and session listings; it need not be
  unique. Resolution (`session_display_name`): the name the user set, else the W&B run's
  name, else None (the recipe's name is in the session's `user_metadata` already). Empty
  strings count as unset.
- A recipe's default name (`recipe_session_name`) is the W&B name the user chose when there is
  one, else `cookbook-` followed by the slugs of its parts (the recipe, then what tells its runs
  apart: dataset, environment, stage), None parts skipped: `recipe_session_name("math-rl",
  "gsm8k")` is `"cookbook-math-rl-gsm8k"`. A slug is the text lowercased, every run of
  characters outside `[a-z0-9]` made one hyphen, hyphens stripped at both ends.
"""

from __future__ import annotations

import re

__all__ = ["recipe_session_name", "session_display_name", "slug"]

_NOT_SLUG = re.compile(r"[^a-z0-9]+")


def session_display_name(*, session_name: str | None, wandb_name: str | None) -> str | None:
    """The display name of a session: `session_name`, else `wandb_name`, else None.

    Examples:
        >>> session_display_name(session_name="", wandb_name="run-1")
        'run-1'
    """
    return session_name or wandb_name or None


def slug(text: str) -> str:
    """`text` lowercased, each run of characters outside `[a-z0-9]` one hyphen, trimmed.

    Examples:
        >>> slug("  Math RL / GSM8K! ")
        'math-rl-gsm8k'
    """
    return _NOT_SLUG.sub("-", text.lower()).strip("-")


def recipe_session_name(*parts: str | None, wandb_name: str | None = None) -> str:
    """A recipe's default session name: `wandb_name` when set, else `cookbook-<part slugs>`.

    Examples:
        >>> recipe_session_name("math-rl", None, "GSM8K")
        'cookbook-math-rl-gsm8k'
    """
    if wandb_name:
        return wandb_name
    slugs = (slug(part) for part in ("cookbook", *parts) if part)
    return "-".join(s for s in slugs if s)
