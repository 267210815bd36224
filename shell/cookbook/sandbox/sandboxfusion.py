"""`tinker_cookbook.sandbox.sandboxfusion`: re-exported from `shell.sandboxes._remote`."""

from shell.sandboxes._remote import (
    SandboxFusionClient,
)

__all__ = [
    "SandboxFusionClient",
]
