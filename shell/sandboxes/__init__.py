"""The cookbook's `tinker_cookbook.sandbox`: code-execution sandboxes for tools and graders.

The protocol and records (`SandboxInterface`, `SandboxResult`, `SandboxTerminatedError`,
`SandboxResource`) under the cookbook's names, and one local implementation, `LocalSandbox`
(a subprocess with time and memory limits and, where the kernel allows, no network; its module
docstring lists what is and is not enforced). The cookbook's remote backends (`_remote`):
`SandboxBackend`, `SandboxFusionClient` (an HTTP client of a SandboxFusion server, a docker
container rlpure does not run) and `ModalSandbox` / `ModalSandboxPool` (Modal is not integrated:
they raise `ConfigError` when built). And `_run_code`: SandboxFusion's `POST /run_code` served
on loopback over `LocalSandbox` (`rlpure sandbox-serve`, `running_run_code_server`), so a
grader written for SandboxFusion runs code here without docker; it refuses what a web page
could send (an `Origin`, a non-loopback `Host`, a non-JSON `Content-Type`) and caps requests.
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
from shell.sandboxes._remote import (
    MODAL_UNAVAILABLE,
    SANDBOXFUSION_START,
    ModalSandbox,
    ModalSandboxPool,
    SandboxBackend,
    SandboxFusionClient,
)
from shell.sandboxes._run_code import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_FETCH_BYTES,
    MAX_MEMORY_LIMIT_MB,
    MAX_RUN_TIMEOUT,
    RUN_CODE_COMMAND,
    CommandRunResult,
    RunCodeRequest,
    RunCodeResponse,
    run_code,
    run_code_app,
    running_run_code_server,
    serve_run_code,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_FETCH_BYTES",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "MAX_MEMORY_LIMIT_MB",
    "MAX_RUN_TIMEOUT",
    "MODAL_UNAVAILABLE",
    "RUN_CODE_COMMAND",
    "SANDBOXFUSION_START",
    "CommandRunResult",
    "LocalSandbox",
    "ModalSandbox",
    "ModalSandboxPool",
    "RunCodeRequest",
    "RunCodeResponse",
    "SandboxBackend",
    "SandboxFusionClient",
    "SandboxInterface",
    "SandboxResource",
    "SandboxResult",
    "SandboxTerminatedError",
    "network_namespaces_available",
    "run_code",
    "run_code_app",
    "running_run_code_server",
    "serve_run_code",
]
