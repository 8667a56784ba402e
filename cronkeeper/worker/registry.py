"""Task handlers: registered by short name with ``@task("name")``, or reached by import path
``package.module:function``.

Security rule: an outbox row names a task, and anyone who can write a row could name any
importable function. So an import path only resolves to a function marked as a handler with
``@task`` (with or without a short name); any other callable is an unknown task (permanent).

Payload shape: ``@task(..., payload=Shape)`` where Shape is a TypedDict or a dataclass (or,
without ``payload=``, the annotation of the handler's first parameter when it is one of those).
A payload that does not fit is a permanent failure. A dataclass shape is passed to the handler
as an instance; a TypedDict shape as the dict.

Isolation: ``@task(..., isolation="process")`` runs this handler in one of the worker's pooled
child processes (killed at its timeout) even on a ``--isolation thread`` worker;
``isolation="thread"`` keeps it on a thread even on a ``--isolation process`` worker; ``None``
(the default) follows the worker. A handler may be an ``async def`` (``is_async``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, is_typeddict

from cronkeeper.errors import CronkeeperError

Handler = Callable[[Any, Any], Any]
_MARK = "__cronkeeper_task__"


class Isolation(StrEnum):
    """Where a task handler runs (``--isolation``, ``@task(isolation=...)``)."""

    THREAD = "thread"
    PROCESS = "process"


class UnknownTask(CronkeeperError):
    """No handler for the job's task: permanent."""


class PayloadError(CronkeeperError):
    """The payload does not fit the handler's declared shape: permanent."""


@dataclass(frozen=True, slots=True)
class TaskHandler:
    name: str
    func: Handler
    shape: type | None = None
    isolation: Isolation | None = None  # None: as the worker's --isolation

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    def prepare(self, payload: Any) -> Any:
        """The payload as the handler wants it, or PayloadError."""
        return check_shape(self.shape, payload) if self.shape is not None else payload


_REGISTRY: dict[str, TaskHandler] = {}


def task(
    name: str | None = None, *, payload: type | None = None, isolation: str | None = None
) -> Callable[[Handler], Handler]:
    """Mark a function as a task handler; register it under ``name`` when given."""
    if isolation is not None and isolation not in set(Isolation):
        raise ValueError(f"@task(isolation={isolation!r}): expected 'thread', 'process' or None")

    def mark(func: Handler) -> Handler:
        shape = payload if payload is not None else _annotated_shape(func)
        handler = TaskHandler(name or f"{func.__module__}:{func.__qualname__}", func, shape,
                              None if isolation is None else Isolation(isolation))
        setattr(func, _MARK, handler)
        if name is not None:
            _REGISTRY[name] = handler
        return func

    return mark


def registered() -> dict[str, TaskHandler]:
    return dict(_REGISTRY)


def resolve(name: str) -> TaskHandler:
    """The handler for a task name; UnknownTask (permanent) when there is none."""
    handler = _REGISTRY.get(name)
    if handler is not None:
        return handler
    if ":" not in name:
        raise UnknownTask(f"unknown task {name!r}: no handler registered under that name "
                          "(load its module with --import, or name it as package.module:function)")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure means: no such task here
        raise UnknownTask(f"unknown task {name!r}: cannot import {module_name!r} "
                          f"({type(exc).__name__}: {exc})") from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
    handler = getattr(target, _MARK, None)
    if not isinstance(handler, TaskHandler):
        raise UnknownTask(f"unknown task {name!r}: {attr!r} in {module_name!r} is not a function "
                          "marked with @cronkeeper.worker.task")
    return handler


def import_modules(names: list[str]) -> None:
    """--import MODULE: load modules whose @task decorators register short names."""
    for module_name in names:
        try:
            importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - reported as a usage error
            from cronkeeper.errors import UsageError

            hint = ""
            missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
            if missing and (module_name == missing or module_name.startswith(missing + ".")):
                # The module itself (or its package) is not found, not one it imports: the
                # `cronkeeper` script's path holds its own environment, not the current directory.
                hint = (" (the worker imports from its own Python environment, whose path does "
                        "not include the current directory: install the package there, or set "
                        "PYTHONPATH)")
            raise UsageError(f"--import {module_name}: {type(exc).__name__}: {exc}{hint}") from None


def _annotated_shape(func: Handler) -> type | None:
    try:
        params = list(inspect.signature(func).parameters.values())
        hints = typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - unresolved annotations declare nothing
        return None
    if not params:
        return None
    shape = hints.get(params[0].name)
    if isinstance(shape, type) and (is_typeddict(shape) or dataclasses.is_dataclass(shape)):
        return shape
    return None


_SIMPLE = (str, int, float, bool, list, dict, type(None))


def check_shape(shape: type, payload: Any) -> Any:
    if not isinstance(payload, dict):
        raise PayloadError(f"payload must be a JSON object, got {type(payload).__name__}")
    if dataclasses.is_dataclass(shape):
        try:
            hints = typing.get_type_hints(shape)
        except Exception:  # noqa: BLE001
            hints = {}
        fields = {f.name: f for f in dataclasses.fields(shape)}
        unknown = sorted(set(payload) - set(fields))
        if unknown:
            raise PayloadError(f"payload has unknown keys {unknown} for {shape.__name__}")
        for key, value in payload.items():
            _check_type(shape.__name__, key, hints.get(key), value)
        try:
            return shape(**payload)
        except TypeError as exc:
            raise PayloadError(f"payload does not fit {shape.__name__}: {exc}") from None
    hints = typing.get_type_hints(shape)
    missing = sorted(k for k in getattr(shape, "__required_keys__", ()) if k not in payload)
    if missing:
        raise PayloadError(f"payload lacks required keys {missing} of {shape.__name__}")
    for key, value in payload.items():
        if key not in hints:
            raise PayloadError(f"payload has unknown key {key!r} for {shape.__name__}")
        _check_type(shape.__name__, key, hints[key], value)
    return payload


def _check_type(shape_name: str, key: str, hint: Any, value: Any) -> None:
    """Check simple annotations (str, int, float, bool, list, dict, X | None); others pass."""
    if hint is None or hint is Any:
        return
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    allowed: list[type] = []
    for option in options:
        base = typing.get_origin(option) or option
        if base not in _SIMPLE:
            return  # a type this check does not understand (nested shapes, Literal, ...)
        allowed.append(base)
    if float in allowed:
        allowed.append(int)
    if any(isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in allowed):
        return
    names = " | ".join(t.__name__ for t in allowed)
    raise PayloadError(
        f"payload key {key!r} of {shape_name} must be {names}, got {type(value).__name__}"
    )
