"""Counting the JAX traces a block of code causes, for the tests that pin "this does not retrace".

`count_compiles()` is a context manager that listens to JAX's public monitoring events
(`jax.monitoring`) while its block runs: every trace of a jitted function records a
`/jax/core/compile/jaxpr_trace_duration` event naming the traced Python function, and every
XLA compilation a `/jax/core/compile/backend_compile_duration` event. Unlike a jitted function's
private `_cache_size()`, this needs no JAX internals, counts only what the block itself caused
(a warm cache from earlier tests does not matter) and sees a retrace even when the cache
already holds an entry for the new shapes' bucket.

Traces are keyed by the traced function's `__name__` (`jax.jit` keeps it), so two jitted
functions with the same name share a count: give the ones a test counts distinct names.
Eager `jax.numpy` calls inside the block also trace small primitives (`broadcast_in_dim`, ...);
they appear under their own names and never under a counted function's.

The listener is global to the process (JAX's listeners are), so compilations on other threads
during the block are counted too. On first use the helper checks, with a fresh function, that
JAX still reports traces this way; if a JAX upgrade renamed the event it raises instead of
letting every "no retrace" assertion pass vacuously.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> double = jax.jit(lambda x: 2 * x)
    >>> with count_compiles() as compiled:
    ...     _ = double(jnp.ones(3))
    ...     _ = double(jnp.ones(3))  # same shape: no new trace
    >>> compiled.traces_of(double)
    1
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
from jax import monitoring

__all__ = ["CompileCount", "count_compiles"]

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCount:
    """What one `count_compiles()` block caused.

    Attributes:
        traces: number of traces per traced function name.
        backend_compiles: number of XLA compilations per module name (`jit(<name>)`).
    """

    def __init__(self) -> None:
        self.traces: collections.Counter[str] = collections.Counter()
        self.backend_compiles: collections.Counter[str] = collections.Counter()

    def traces_of(self, jitted: Callable[..., object]) -> int:
        """How many times the block traced `jitted` (a `jax.jit`-wrapped function).

        Raises:
            TypeError: `jitted` is not a jitted function (counting a plain function would
                always give 0).
        """
        if not hasattr(jitted, "lower"):
            raise TypeError(f"traces_of: expected a jax.jit function, got {jitted!r}")
        return self.traces[jitted.__name__]

    def _record(self, event: str, duration_secs: float, **kwargs: str | int) -> None:
        name = str(kwargs.get("fun_name", "?"))
        if event == TRACE_EVENT:
            self.traces[name] += 1
        elif event == BACKEND_COMPILE_EVENT:
            self.backend_compiles[name] += 1


@contextlib.contextmanager
def _listening() -> Iterator[CompileCount]:
    count = CompileCount()
    monitoring.register_event_duration_secs_listener(count._record)
    try:
        yield count
    finally:
        monitoring.unregister_event_duration_listener(count._record)


@functools.cache
def _check_jax_reports_traces() -> None:
    """Raises `RuntimeError` when a fresh jitted function's trace goes unreported."""

    def compile_count_probe(x: jax.Array) -> jax.Array:
        return x + 1

    probe = jax.jit(compile_count_probe)
    with _listening() as count:
        probe(jnp.zeros(())).block_until_ready()
    if count.traces_of(probe) != 1:
        raise RuntimeError(
            f"tests/compile_count.py: JAX no longer reports traces as {TRACE_EVENT!r} events "
            f"with a fun_name (saw {dict(count.traces)}); update the helper"
        )


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileCount]:
    """Counts the traces and XLA compilations caused while the block runs (see module doc)."""
    _check_jax_reports_traces()
    with _listening() as count:
        yield count
