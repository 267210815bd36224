"""`rlpure serve`: Tinker's HTTP API (SDK 0.38) on localhost, over the local JAX backend.

Point any Tinker script at it, unchanged:

    rlpure serve --port 8000
    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-local python my_tinker_script.py

Conventions:
- One process owns the models (`Engine`: a `LocalServiceClient` on a worker thread); any number
  of SDK clients, in any number of processes, share it. State (checkpoints, sampler weights,
  training runs, checkpoint expiry, tokenizer folders) lives under `--state-dir` (default
  `shell.data_dir.rlpure_data_dir()`, the same store an in-process `LocalServiceClient()` uses),
  so it survives restarts and a run resumes across one.
- Safe by default: binds 127.0.0.1; any other host needs `--api-key`; with a key set every
  request must carry it (`X-API-Key`, which the SDK sends from `TINKER_API_KEY`); request bodies
  are size-limited; checkpoint paths resolve inside the state dir only; nothing is unpickled.
- SIGINT/SIGTERM: new work is refused, the operation in progress finishes (a checkpoint being
  written is completed), queued ones fail with a message, then the server exits.
- Layout: `_app` (routes, middleware), `_ops` (requests → local client calls), `_engine`
  (worker thread, ordering, futures, sessions, samplers), `_wire` (protobuf bodies), `_paths`
  (tinker paths ↔ the state dir), `_ttl` (checkpoint expiry), `_replies` (response bodies).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from tinker import types

from shell.commands import Command
from shell.config import MAX_SEED
from shell.data_dir import rlpure_data_dir
from shell.errors import ConfigError
from shell.local._models import PACKAGED_MODELS, cached_hf_models
from shell.loopback import is_loopback_host
from shell.serve._app import CLIENT_CONFIG, build_app
from shell.serve._engine import Engine

__all__ = ["CLIENT_CONFIG", "COMMAND", "Engine", "build_app", "serve", "served_models"]

_logger = logging.getLogger("rlpure.serve")

_JANITOR_S = 30.0
_SWITCH_INTERVAL_S = 0.001
"""The GIL switch interval while serving (Python's default is 5 ms): a request waits up to this
long for the GIL whenever the worker thread runs Python (a model's host-side code)."""


def served_models(engine: Engine) -> types.GetServerCapabilitiesResponse:
    """The models this machine can serve: the toy configs, the packaged checkpoints that are
    installed and the Hugging Face cache's models (a local checkpoint directory also works)."""
    models = [
        types.SupportedModel(
            model_name=name, max_context_length=config.max_seq_len, trainable=True, sampleable=True
        )
        for name, config in sorted(engine.service.model_configs.items())
    ]
    names = [
        name
        for name, packaged in PACKAGED_MODELS.items()
        if importlib.util.find_spec(packaged.package) is not None
    ]
    names += [name for name in cached_hf_models() if name not in names]
    models += [
        types.SupportedModel(model_name=name, trainable=True, sampleable=True) for name in names
    ]
    return types.GetServerCapabilitiesResponse(supported_models=models)


def _janitor(engine: Engine, stop: threading.Event) -> None:
    """Releases idle sessions, deletes expired checkpoints and forgets old results until
    `stop`."""
    while not stop.wait(_JANITOR_S):
        for session_id in engine.release_idle_sessions():
            _logger.info(
                "session %s released (no heartbeat for %.0f s)",
                session_id,
                engine.session_timeout_s,
            )
        engine.delete_expired_checkpoints()
        engine.purge_results()


def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    state_dir: Path | None = None,
    api_key: str | None = None,
    seed: int = 0,
    max_samplers: int = 8,
    max_body_mb: int = 128,
    session_timeout_s: int = 900,
    verbose: bool = False,
    **service_options: Any,
) -> int:
    """Runs the server until SIGINT/SIGTERM (see module doc); returns the exit code.

    Raises:
        ConfigError: a non-loopback `host` without `api_key`, a port that cannot be bound, a
            state dir that cannot be made, or a seed outside `[0, MAX_SEED]` or non-positive size; each
            before anything starts.
    """
    for flag, value, least in (
        ("--seed", seed, 0),
        ("--max-samplers", max_samplers, 1),
        ("--max-body-mb", max_body_mb, 1),
        ("--session-timeout", session_timeout_s, 1),
    ):
        if value < least:
            raise ConfigError(f"{flag} {value}: expected an integer >= {least}")
    if seed > MAX_SEED:  # `jax.random.key` takes an int64: every model would fail to start
        raise ConfigError(f"--seed {seed}: expected an integer in [0, {MAX_SEED}]")
    if not is_loopback_host(host) and not api_key:
        raise ConfigError(
            f"--host {host}: serving beyond this machine needs --api-key (anyone who can reach "
            "the port could train and read checkpoints)"
        )
    state = Path(state_dir) if state_dir is not None else rlpure_data_dir()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: without, a response's head and body wait out the
    # client's delayed ACK (Nagle), ~40 ms a request (uvicorn sets it only on sockets it binds)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as err:  # OverflowError: a port outside 0-65535
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot listen there: {err}") from err
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        sock.close()
        raise ConfigError(f"--state-dir {state}: cannot make it a directory: {err}") from err
    bound_port = sock.getsockname()[1]
    engine = Engine(
        state_dir=state,
        seed=seed,
        max_samplers=max_samplers,
        session_timeout_s=float(session_timeout_s),
        **service_options,
    )
    capabilities = served_models(engine)
    app = build_app(
        engine, api_key=api_key, max_body_bytes=max_body_mb << 20, capabilities=capabilities
    )
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{bound_port}"
    names = ", ".join(model.model_name or "" for model in capabilities.supported_models)
    print(
        f"rlpure serve: {url} (models: {names}; state: {state}); clients: "
        f"TINKER_BASE_URL={url} TINKER_API_KEY={'<your key>' if api_key else 'tml-local'}",
        flush=True,
    )
    config = uvicorn.Config(
        app,
        log_level="info" if verbose else "warning",
        access_log=verbose,
        timeout_graceful_shutdown=10,
        lifespan="off",
    )
    server = _Server(config, engine)
    stop = threading.Event()
    janitor = threading.Thread(target=_janitor, args=(engine, stop), daemon=True)
    janitor.start()
    # uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown, with the handlers it found
    # installed: with these, that ends `run` instead of the process, so the engine closes here
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    try:
        server.run(sockets=[sock])
    finally:
        sys.setswitchinterval(switch_interval)
        stop.set()
        engine.close()
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, closing the engine first on SIGINT/SIGTERM so long-polls end."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig: int, frame: Any) -> None:
        threading.Thread(target=self.engine.close, daemon=True).start()
        super().handle_exit(sig, frame)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free one)")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="checkpoints, runs and tokenizers (default: $RLPURE_HOME, else "
        "$XDG_DATA_HOME/rlpure, else ~/.local/share/rlpure)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="require this key in X-API-Key (clients: TINKER_API_KEY=<key>; the SDK wants keys "
        "that start with 'tml-'); required with a non-loopback --host",
    )
    parser.add_argument("--seed", type=int, default=0, help="the local backend's seed")
    parser.add_argument(
        "--max-samplers", type=int, default=8, help="sampling clients kept in memory at once"
    )
    parser.add_argument("--max-body-mb", type=int, default=128, help="largest request body")
    parser.add_argument(
        "--session-timeout",
        type=int,
        default=900,
        help="seconds without a client heartbeat before a session's models are released "
        "(default 900; raise it for clients that sleep, e.g. a suspended laptop)",
    )
    # no default here: `rlpure -v serve` sets it before the subcommand, which must not reset it
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log every request"
    )


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("filelock").setLevel(logging.WARNING)  # a line per compile-cache read
    started = time.time()
    code = serve(
        host=args.host,
        port=args.port,
        state_dir=args.state_dir,
        api_key=args.api_key,
        seed=args.seed,
        max_samplers=args.max_samplers,
        max_body_mb=args.max_body_mb,
        session_timeout_s=args.session_timeout,
        verbose=args.verbose,
    )
    print(f"rlpure serve: stopped after {time.time() - started:.0f} s", flush=True)
    return code


COMMAND = Command(
    "serve",
    help="Serve Tinker's HTTP API on localhost over the local backend, so Tinker code runs "
    "offline unchanged.",
    run=_run,
    add_arguments=_add_arguments,
    description=(
        "Serves the HTTP API the tinker SDK (0.38) speaks, over rlpure's local JAX models. "
        "Point an unmodified Tinker script or the tinker-cookbook at it with two environment "
        "variables: TINKER_BASE_URL=http://127.0.0.1:PORT and TINKER_API_KEY=tml-local (any "
        "key starting with 'tml-'; the SDK refuses others; with --api-key, that key). "
        "TINKER_TELEMETRY=0 stops the SDK's telemetry (the server accepts and drops it). "
        "Checkpoints are tinker:// paths stored under --state-dir."
    ),
)
"""`rlpure serve`."""
