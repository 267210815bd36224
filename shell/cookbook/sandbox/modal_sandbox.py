"""`tinker_cookbook.sandbox.modal_sandbox`: re-exported from `shell.sandboxes._remote`.

Modal is not integrated: `ModalSandbox` and `ModalSandboxPool` raise `ConfigError` with one
line when built (the module itself imports without `modal`).
"""

from shell.errors import (
    SandboxError,
)
from shell.sandboxes._interface import (
    SandboxResult,
    SandboxTerminatedError,
)
from shell.sandboxes._remote import (
    ModalSandbox,
    ModalSandboxPool,
)

__all__ = [
    "ModalSandbox",
    "ModalSandboxPool",
    "SandboxError",
    "SandboxResult",
    "SandboxTerminatedError",
]
