"""`tinker_cookbook.sandbox.local_sandbox`: re-exported from `shell.sandboxes._local`."""

from shell.sandboxes._interface import (
    SandboxResult,
    SandboxTerminatedError,
)
from shell.sandboxes._local import (
    DEFAULT_MAX_OUTPUT_BYTES,
    LocalSandbox,
    network_namespaces_available,
)

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "LocalSandbox",
    "SandboxResult",
    "SandboxTerminatedError",
    "network_namespaces_available",
]
