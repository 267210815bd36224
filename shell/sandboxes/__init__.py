"""The cookbook's `tinker_cookbook.sandbox`: code-execution sandboxes for tools and graders.

The protocol and records (`SandboxInterface`, `SandboxResult`, `SandboxTerminatedError`,
`SandboxResource`) under the cookbook's names, and one local implementation, `LocalSandbox`
(a subprocess with time and memory limits and, where the kernel allows, no network; its module
docstring lists what is and is not enforced). The cookbook's remote backends
(`SandboxFusionClient`, `ModalSandbox`, `SandboxBackend`) need services rlpure does not run and
are not provided.
"""

from shell.sandboxes._interface import (
    SandboxInterface,
    SandboxResource,
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
    "SandboxInterface",
    "SandboxResource",
    "SandboxResult",
    "SandboxTerminatedError",
    "network_namespaces_available",
]
