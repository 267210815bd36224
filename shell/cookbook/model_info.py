"""`tinker_cookbook.model_info`: re-exported from `shell.model_meta`."""

from shell.errors import (
    ConfigError,
)
from shell.model_meta import (
    ModelAttributes,
    get_model_attributes,
    get_recommended_renderer_name,
    get_recommended_renderer_names,
    warn_if_renderer_not_recommended,
)

__all__ = [
    "ConfigError",
    "ModelAttributes",
    "get_model_attributes",
    "get_recommended_renderer_name",
    "get_recommended_renderer_names",
    "warn_if_renderer_not_recommended",
]
