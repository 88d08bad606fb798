"""One conversion between results and JSON: ``to_jsonable`` writes any result, ``from_jsonable`` reads it back
into its type by the type's annotations, so a recorded result and a live one are the same object.

``from_jsonable(Type, data)`` knows dataclasses (fields by name; a missing field with a default takes it),
``tuple[X, ...]``, ``tuple[X, Y]``, ``list[X]``, ``dict[K, V]`` (JSON's string keys turned back into int
or float keys), ``X | None`` and unions, ``float`` (``"nan"``, ``"inf"``, ``"-inf"`` included), ``int``,
``bool``, ``str``, ``Literal`` and ``Any``. What does not fit raises ``ValueError`` with the path to the
offending value, e.g. ``Parity.final_losses['fp32'][2]: expected float, got 'x'``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

import numpy as np
import torch

T = TypeVar("T")

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def to_jsonable(obj: Any) -> Any:
    """Convert dataclasses, numpy and torch values, tuples and paths into plain JSON types.

    Non-finite floats become the strings ``"inf"``, ``"-inf"`` and ``"nan"`` so the file stays strict JSON.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return to_jsonable(obj.detach().cpu().tolist())
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, torch.dtype):
        return str(obj)
    raise TypeError(f"cannot store a {type(obj).__name__} in a record")


def from_jsonable(tp: type[T] | Any, data: Any) -> T:
    """``data`` (as :func:`to_jsonable` or a record wrote it) converted to type ``tp``; see the module."""
    return _convert(tp, data, getattr(tp, "__name__", str(tp)))


def _fail(path: str, expected: str, data: Any) -> ValueError:
    shown = repr(data)
    return ValueError(f"{path}: expected {expected}, got {shown[:80]}")


def _convert(tp: Any, data: Any, path: str) -> Any:
    if tp is Any or tp is object:
        return data
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, data, path)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        errors = []
        for member in (a for a in args if a is not type(None)):
            try:
                return _convert(member, data, path)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors) if len(errors) == 1 else f"{path}: fits none of {tp}: {errors}")
    if origin is typing.Literal:
        if data in args:
            return data
        raise _fail(path, f"one of {args}", data)
    if origin in (tuple, list):
        if not isinstance(data, (list, tuple)):
            raise _fail(path, origin.__name__, data)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(data):
                raise ValueError(f"{path}: expected {len(args)} items, got {len(data)}")
            items = [_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, data))]
        else:
            item = args[0] if args else Any
            items = [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(data)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(data, dict):
            raise _fail(path, "an object", data)
        key_tp, value_tp = args if args else (Any, Any)
        return {_key(key_tp, k, path): _convert(value_tp, v, f"{path}[{k!r}]") for k, v in data.items()}
    if tp in (tuple, list):
        if not isinstance(data, (list, tuple)):
            raise _fail(path, tp.__name__, data)
        return tp(data)
    if tp is float:
        if isinstance(data, str) and data in _NONFINITE:
            return _NONFINITE[data]
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise _fail(path, "float", data)
    if tp is bool:
        if isinstance(data, bool):
            return data
        raise _fail(path, "bool", data)
    if tp is int:
        if isinstance(data, int) and not isinstance(data, bool):   # 3.0 is not an int: JSON kept the type
            return data
        raise _fail(path, "int", data)
    if tp is str:
        if isinstance(data, str):
            return data
        raise _fail(path, "str", data)
    if tp is type(None):
        if data is None:
            return None
        raise _fail(path, "null", data)
    raise TypeError(f"{path}: from_jsonable cannot build a {tp!r}")


def _key(tp: Any, key: str, path: str) -> Any:
    if tp is int:
        try:
            return int(key)
        except ValueError:
            raise ValueError(f"{path}: key {key!r} is not an int") from None
    if tp is float:
        try:
            return float(key)
        except ValueError:
            raise ValueError(f"{path}: key {key!r} is not a number") from None
    return key


def _dataclass(tp: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise _fail(path, f"an object for {tp.__name__}", data)
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{path}: {tp.__name__} has no field {', '.join(map(repr, unknown))}")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], f"{path}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{path}: {tp.__name__} needs field {name!r}, which the data lacks")
    return tp(**kwargs)
