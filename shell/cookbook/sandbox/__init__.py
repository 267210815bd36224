"""`tinker_cookbook.sandbox`: re-exported from `shell.sandboxes`."""

from shell.sandboxes import (
    DEFAULT_MAX_OUTPUT_BYTES,
    LocalSandbox,
    SandboxBackend,
    SandboxFusionClient,
    SandboxInterface,
    SandboxResource,
    SandboxResult,
    SandboxTerminatedError,
    network_namespaces_available,
)

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "LocalSandbox",
    "SandboxBackend",
    "SandboxFusionClient",
    "SandboxInterface",
    "SandboxResource",
    "SandboxResult",
    "SandboxTerminatedError",
    "network_namespaces_available",
]
