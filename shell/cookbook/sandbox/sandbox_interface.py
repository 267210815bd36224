"""`tinker_cookbook.sandbox.sandbox_interface`: re-exported from `shell.sandboxes._interface`."""

from shell.errors import (
    SandboxError,
)
from shell.sandboxes._interface import (
    SandboxInterface,
    SandboxResource,
    SandboxResult,
    SandboxTerminatedError,
)

__all__ = [
    "SandboxError",
    "SandboxInterface",
    "SandboxResource",
    "SandboxResult",
    "SandboxTerminatedError",
]
