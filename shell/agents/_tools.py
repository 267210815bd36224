"""The cookbook's `tinker_cookbook.tool_use.tools`: `@tool` functions and tool-call dispatch.

`@tool` turns a function or method returning a `ToolResult` into a `FunctionTool`: its name is
the function's, its description the docstring, and its argument schema a pydantic model built
from the signature (`Annotated[T, "description"]` or `Annotated[T, Field(...)]` describe an
argument), so the JSON schema shown to the model is the cookbook's. `handle_tool_call` runs one
parsed `ToolCall` against a name → tool table. Bad model output never raises: an unknown tool,
arguments that are not JSON, arguments of the wrong type and a tool that raises each become an
error `ToolResult` (a `tool` message `{"error": ...}` with `metadata["error"]` set to
`tool_not_found`, `json_decode_failed`, `validation_failed` or `execution_failed`), as the
cookbook's.

Additions to the cookbook, on purpose (a hanging or raising tool must not crash a rollout):
- `timeout_seconds` on `tool(...)` / `FunctionTool(...)` / `handle_tool_call(...)`: a call that
  runs longer becomes an error result with `metadata["error"] == "timeout"` (a `TimeoutError`
  the tool raises itself is an `execution_failed` one, as any other exception). An async tool
  is cancelled; a synchronous one under a timeout (its own or `handle_tool_call`'s) runs in a
  worker thread, which Python cannot stop —
  the rollout goes on, the thread finishes in the background (put code that may loop forever in
  a `shell.sandboxes.LocalSandbox` subprocess, which is killed).
- `handle_tool_call` also turns an exception from a custom `Tool.run` into an
  `execution_failed` result (the cookbook's lets it propagate and fail the rollout).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin, get_type_hints, overload

from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shell.agents._tool_types import Tool, ToolInput, ToolResult
from shell.chat._base import ContentPart, ToolCall, ToolSpec

__all__ = [
    "FunctionTool",
    "error_tool_result",
    "handle_tool_call",
    "simple_tool_result",
    "tool",
]


def simple_tool_result(
    content: str | list[ContentPart],
    *,
    call_id: str = "",
    name: str = "",
    should_stop: bool = False,
    metrics: dict[str, float] | None = None,
    metadata: dict[str, Any] | None = None,
) -> ToolResult:
    """A `ToolResult` holding one `tool` message with `content`.

    Args:
        content: text, or content parts (text and images in any order).
        call_id: the tool call's id (`FunctionTool` fills it in when empty).
        name: the tool's name (`FunctionTool` fills it in when empty).
        should_stop: whether the episode should end after this call.
        metrics: the call's metrics.
        metadata: diagnostics.

    Examples:
        >>> simple_tool_result("4", name="calculator").messages[0]["content"]
        '4'
    """
    return ToolResult(
        messages=[{"role": "tool", "content": content, "tool_call_id": call_id, "name": name}],
        should_stop=should_stop,
        metrics=dict(metrics or {}),
        metadata=dict(metadata or {}),
    )


def error_tool_result(
    error_msg: str,
    *,
    call_id: str = "",
    name: str = "",
    error_type: str = "execution_error",
    should_stop: bool = False,
) -> ToolResult:
    """A `ToolResult` whose `tool` message is `{"error": error_msg}` as JSON.

    Args:
        error_msg: what went wrong, shown to the model.
        call_id: the tool call's id.
        name: the tool's name.
        error_type: the error's category, kept in `metadata["error"]`.
        should_stop: whether the episode should end after this call.
    """
    return ToolResult(
        messages=[
            {
                "role": "tool",
                "content": json.dumps({"error": error_msg}),
                "tool_call_id": call_id,
                "name": name,
            }
        ],
        should_stop=should_stop,
        metrics={},
        metadata={"error": error_type},
    )


def _annotated_parts(annotation: Any) -> tuple[Any, FieldInfo | None, str | None]:
    """`(type, FieldInfo or None, description or None)` of a possibly `Annotated` hint."""
    if get_origin(annotation) is not Annotated:
        return annotation, None, None
    base, *extras = get_args(annotation)
    field_info: FieldInfo | None = None
    description: str | None = None
    for extra in extras:
        if isinstance(extra, str) and description is None:
            description = extra
        elif isinstance(extra, FieldInfo):
            field_info = extra
            if extra.description and description is None:
                description = extra.description
    return base, field_info, description


def _params_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    """A pydantic model of `fn`'s parameters (`self` left out), named `<name>_params`."""
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for param_name, param in inspect.signature(fn).parameters.items():
        if param_name == "self":
            continue
        base, field_info, description = _annotated_parts(hints.get(param_name, Any))
        default = ... if param.default is inspect.Parameter.empty else param.default
        if field_info is None:
            fields[param_name] = (base, Field(default, description=description))
        else:
            if field_info.default is PydanticUndefined and default is not ...:
                field_info.default = default
            fields[param_name] = (base, field_info)
    model: type[BaseModel] = create_model(f"{name}_params", **fields)
    return model


# Set while `handle_tool_call` holds a deadline over a tool: a synchronous `FunctionTool` then
# runs in a worker thread, where the deadline can fire (in the event loop it could not).
_UNDER_DEADLINE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "rlpure_tool_under_deadline", default=False
)


class FunctionTool:
    """A `Tool` made from a function or method returning a `ToolResult` (see `tool`).

    Accessed on an instance (a `@tool` method), it binds to that instance.

    Args:
        fn: the function; sync or async.
        timeout_seconds: a call running longer becomes a `timeout` error result; None: no limit.
    """

    def __init__(self, fn: Callable[..., Any], *, timeout_seconds: float | None = None) -> None:
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise ValueError(f"FunctionTool.timeout_seconds: expected > 0, got {timeout_seconds}")
        self._fn = fn
        self._instance: Any = None
        self._name: str = fn.__name__
        self._description: str = fn.__doc__ or ""
        self._params_model = _params_model(fn, self._name)
        self.timeout_seconds = timeout_seconds

    @property
    def name(self) -> str:
        """The function's name."""
        return self._name

    @property
    def description(self) -> str:
        """The function's docstring ("" without one)."""
        return self._description

    @property
    def parameters_schema(self) -> dict[str, Any]:
        """The JSON Schema of the arguments (pydantic's, as the cookbook's)."""
        return self._params_model.model_json_schema()

    def to_spec(self) -> ToolSpec:
        """The tool as a renderer `ToolSpec`."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters_schema,
        }

    async def _call(self, kwargs: dict[str, Any]) -> Any:
        args = () if self._instance is None else (self._instance,)
        if inspect.iscoroutinefunction(self._fn):
            return await self._fn(*args, **kwargs)
        if self.timeout_seconds is None and not _UNDER_DEADLINE.get():
            return self._fn(*args, **kwargs)
        # in a thread, so that a deadline (this tool's or `handle_tool_call`'s) can fire
        return await asyncio.to_thread(self._fn, *args, **kwargs)

    async def run(self, input: ToolInput) -> ToolResult:
        """Validates `input.arguments`, calls the function, fills in call id and name.

        Returns:
            The function's result, or an error result (`validation_failed`,
            `execution_failed`, `timeout`); never raises for the tool's own failures.
        """
        call_id = input.call_id or ""
        try:
            validated = self._params_model.model_validate(input.arguments)
        except Exception as e:  # pydantic's ValidationError, or a non-dict payload
            return error_tool_result(
                f"Parameter validation failed: {e}",
                call_id=call_id,
                name=self.name,
                error_type="validation_failed",
            )
        deadline = asyncio.timeout(self.timeout_seconds)
        try:
            async with deadline:
                result = await self._call(validated.model_dump())
        except TimeoutError as e:
            if not deadline.expired():  # the tool's own TimeoutError (a socket's, say)
                return error_tool_result(
                    f"Tool execution failed: {e}",
                    call_id=call_id,
                    name=self.name,
                    error_type="execution_failed",
                )
            return error_tool_result(
                f"Tool execution timed out after {self.timeout_seconds} s",
                call_id=call_id,
                name=self.name,
                error_type="timeout",
            )
        except Exception as e:  # the tool's own failure is the model's feedback, not a crash
            return error_tool_result(
                f"Tool execution failed: {e}",
                call_id=call_id,
                name=self.name,
                error_type="execution_failed",
            )
        if not isinstance(result, ToolResult):
            return error_tool_result(
                f"Tool execution failed: Tool function '{self.name}' must return ToolResult, "
                f"got {type(result).__name__}. Use simple_tool_result() helper for simple cases.",
                call_id=call_id,
                name=self.name,
                error_type="execution_failed",
            )
        for message in result.messages:
            if not message.get("tool_call_id") and input.call_id:
                message["tool_call_id"] = input.call_id
            if not message.get("name"):
                message["name"] = self.name
        return result

    def __get__(self, obj: Any, objtype: type | None = None) -> FunctionTool:
        """Binds the tool to `obj` when it is a method's."""
        if obj is None:
            return self
        bound = FunctionTool.__new__(FunctionTool)
        bound.__dict__.update(self.__dict__)
        bound._instance = obj
        return bound


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...
@overload
def tool(
    *, timeout_seconds: float | None = None
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def tool(
    fn: Callable[..., Any] | None = None, /, *, timeout_seconds: float | None = None
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Makes a `FunctionTool` from a function or method: `@tool` or `@tool(timeout_seconds=5)`.

    The function returns a `ToolResult` (`simple_tool_result` for the plain case); its
    parameters' annotations give the argument schema.

    Examples:
        >>> @tool
        ... async def add(a: Annotated[int, "first"], b: int) -> ToolResult:
        ...     '''Adds two integers.'''
        ...     return simple_tool_result(str(a + b))
        >>> add.to_spec()["parameters"]["required"]
        ['a', 'b']
    """
    if fn is not None:
        return FunctionTool(fn, timeout_seconds=timeout_seconds)
    return lambda f: FunctionTool(f, timeout_seconds=timeout_seconds)


async def handle_tool_call(
    tools: dict[str, Tool], tool_call: ToolCall, *, timeout_seconds: float | None = None
) -> ToolResult:
    """Runs one parsed tool call against `tools` (name → tool).

    Args:
        tools: the available tools by name.
        tool_call: the call the model made.
        timeout_seconds: a call running longer becomes a `timeout` error result.

    Returns:
        The tool's result, or an error result (`tool_not_found`, `json_decode_failed`,
        `validation_failed`, `execution_failed`, `timeout`).
    """
    name = tool_call.function.name
    call_id = tool_call.id or ""
    if name not in tools:
        return error_tool_result(
            f"Tool '{name}' not found", call_id=call_id, name=name, error_type="tool_not_found"
        )
    try:
        arguments = json.loads(tool_call.function.arguments)
    except json.JSONDecodeError as e:
        return error_tool_result(
            f"Failed to parse tool arguments: {e}",
            call_id=call_id,
            name=name,
            error_type="json_decode_failed",
        )
    deadline = asyncio.timeout(timeout_seconds)
    token = _UNDER_DEADLINE.set(timeout_seconds is not None)
    try:
        async with deadline:
            return await tools[name].run(ToolInput(arguments=arguments, call_id=call_id))
    except TimeoutError as e:
        if not deadline.expired():  # a custom Tool.run's own TimeoutError
            return error_tool_result(
                f"Tool execution failed: {e}",
                call_id=call_id,
                name=name,
                error_type="execution_failed",
            )
        return error_tool_result(
            f"Tool execution timed out after {timeout_seconds} s",
            call_id=call_id,
            name=name,
            error_type="timeout",
        )
    except Exception as e:  # a custom Tool.run that raises: the model's feedback, not a crash
        return error_tool_result(
            f"Tool execution failed: {e}", call_id=call_id, name=name, error_type="execution_failed"
        )
    finally:
        _UNDER_DEADLINE.reset(token)
