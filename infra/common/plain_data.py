"""Python values as JSON and back, building only what the caller allows: data, never code.

Checkpoints (:mod:`infra.common.checkpoint_io`) and the scheduler's journal (:mod:`infra.service.journal`) store
their values through this codec instead of pickle, whose loader runs whatever callable a file
names. JSON's own types map to themselves; every other value becomes a one-key object whose key
starts with ``$``:

* ``$tuple``, ``$set``, ``$frozenset``, ``$dict`` (keys that are not strings, or start with ``$``),
  ``$odict`` (an ``OrderedDict`` and its attributes: a torch state dict's ``_metadata``),
  ``$float`` (nan, inf), ``$bytes``, ``$array`` (numpy: dtype, shape, base64 of the bytes),
  ``$np`` (numpy scalars), ``$counter`` (``collections.Counter``), ``$count`` (``itertools.count``),
  ``$rng`` (a numpy ``Generator``: its bit generator's state);
* ``$enum``, ``$ntuple`` (a named tuple), ``$obj`` (the attributes of an instance) and ``$fn`` for the classes and functions
  the :class:`Codec` names, and ``$tensor`` (a key into tensors stored elsewhere, when the caller
  passes a tensor table, and the strides of a tensor not laid out contiguously);
* ``$ref``: the n-th mutable value met before (lists, dicts, sets, arrays, objects), so that two
  references to one object stay one object (the scheduler's placer and plan share their state).

Decoding creates instances with ``cls.__new__`` and sets their attributes: no ``__init__``,
``__setstate__`` or other method runs, and a name outside the codec's lists is refused
(:class:`DataError`).
"""

from __future__ import annotations

import base64
import collections
import itertools
import math
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

_COUNT = re.compile(r"count\((-?\d+)(?:, (-?\d+))?\)")
_BIT_GENERATORS = {"PCG64": np.random.PCG64, "MT19937": np.random.MT19937, "Philox": np.random.Philox,
                   "SFC64": np.random.SFC64}


_ATOMS = frozenset({str, int, bool, float, type(None)})


class DataError(ValueError):
    """A value cannot be written as plain data, or a document names something the codec does not allow."""


MAX_STRIDED_EXTENT = 16
"""How many times its element count a strided tensor's storage may span (a view of every other column
spans twice): more is a crafted layout that would allocate far beyond the data."""


def _check_strides(strides: Any, shape: tuple[int, ...]) -> None:
    """``DataError`` unless ``strides`` are non-negative integers, one per dimension, spanning a storage of at
    most :data:`MAX_STRIDED_EXTENT` times the tensor's elements (checked before the storage is allocated)."""
    if (not isinstance(strides, list) or len(strides) != len(shape)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in strides)):
        raise DataError(f"tensor strides {str(strides)[:80]} do not fit shape {list(shape)}")
    numel = math.prod(shape)
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) if numel else 0
    if extent > MAX_STRIDED_EXTENT * max(numel, 1):
        raise DataError(f"tensor strides {str(strides)[:80]} span {extent} elements for {numel}: a crafted layout")


def _name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


@dataclass(frozen=True)
class Codec:
    """What a document may hold besides plain data.

    Attributes:
        classes: classes whose instances (enum members or attribute sets) may be written and rebuilt.
        functions: module-level functions that may be referenced by name (``time.time`` as a clock).
    """

    classes: tuple[type, ...] = ()
    functions: tuple[Callable[..., Any], ...] = ()
    _by_name: dict[str, Any] = field(init=False, repr=False, compare=False)
    _allowed: frozenset[Any] = field(init=False, repr=False, compare=False)
    _objects: frozenset[type] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {_name(c): c for c in (*self.classes, *self.functions)})
        object.__setattr__(self, "_allowed", frozenset((*self.classes, *self.functions)))
        object.__setattr__(self, "_objects", frozenset(c for c in self.classes if not issubclass(c, (Enum, tuple))))

    def encode(self, value: Any, tensors: dict[str, Any] | None = None) -> Any:
        """``value`` as JSON-able data; tensors go into ``tensors`` (key -> CPU tensor) when given.

        Raises:
            DataError: a value of a type the codec does not know, with its place in ``value``.
        """
        return _Encoder(self, tensors).run(value, "")

    def decode(self, data: Any, tensors: Mapping[str, Any] | None = None) -> Any:
        """The value :meth:`encode` wrote as ``data`` (``tensors``: the table it filled).

        Raises:
            DataError: an unknown tag, or a class, function or tensor the codec does not allow.
        """
        return _Decoder(self, tensors).run(data)

    def allowed(self, name: str) -> Any:
        """The class or function called ``name``, if allowed."""
        try:
            return self._by_name[name]
        except KeyError:
            raise DataError(f"the data names {name!r}, which this file may not hold") from None


def classes_of(modules: Iterable[Any]) -> tuple[type, ...]:
    """Every class defined (not imported) in ``modules``."""
    return tuple(v for m in modules for v in vars(m).values() if isinstance(v, type) and v.__module__ == m.__name__)


def _is_tensor(v: Any) -> bool:
    torch = sys.modules.get("torch")  # a value can only be a tensor once torch is imported
    return torch is not None and isinstance(v, torch.Tensor)


def _strides(t: Any) -> list[int] | None:
    """The strides of a dense tensor stored in another order (channels-last weights and their Adam
    moments), None for a contiguous one: kernels take other paths on other layouts, so a resumed run
    that changed them would not repeat its numbers bit for bit."""
    if t.is_contiguous():
        return None
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return list(t.stride()) if t.permute(order).is_contiguous() else None


def _attributes(obj: Any) -> dict[str, Any]:
    out = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                out[slot] = getattr(obj, slot)
    return out


class _Encoder:
    def __init__(self, codec: Codec, tensors: dict[str, Any] | None) -> None:
        self.codec, self.tensors, self.memo = codec, tensors, {}

    def run(self, v: Any, at: str) -> Any:
        if type(v) in _ATOMS:  # the common case first: a snapshot is mostly these
            return v if type(v) is not float or math.isfinite(v) else {"$float": repr(v)}
        if type(v) in self.codec._objects and id(v) not in self.memo:  # next most common: skip the type tests
            self.memo[id(v)] = (len(self.memo), v)
            return self._object(v, at)
        if isinstance(v, np.generic):  # before float: np.float64 is a float too, and must stay one
            return {"$np": [v.dtype.str, self.run(v.item(), at)]}
        if isinstance(v, Enum):
            self._ok(type(v), at)
            return {"$enum": [_name(type(v)), self.run(v.value, at)]}
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return float(v) if math.isfinite(v) else {"$float": repr(float(v))}
        if isinstance(v, tuple) and hasattr(type(v), "_fields"):  # a NamedTuple: rebuilt by its constructor
            self._ok(type(v), at)
            return {"$ntuple": [_name(type(v)), [self.run(x, f"{at}[{i}]") for i, x in enumerate(v)]]}
        if isinstance(v, tuple) and type(v) is tuple:
            return {"$tuple": [self.run(x, f"{at}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, frozenset):
            return {"$frozenset": [self.run(x, at) for x in v]}
        if isinstance(v, bytes):
            return {"$bytes": base64.b64encode(v).decode()}
        if isinstance(v, (types.FunctionType, types.BuiltinFunctionType)):
            self._ok(v, at)
            return {"$fn": _name(v)}
        if id(v) in self.memo:
            return {"$ref": self.memo[id(v)][0]}
        self.memo[id(v)] = (len(self.memo), v)  # keeps v alive, so its id is not reused while encoding
        return self._mutable(v, at)

    def _mutable(self, v: Any, at: str) -> Any:
        if type(v) is list:
            return [self.run(x, f"{at}[{i}]") for i, x in enumerate(v)]
        if type(v) is dict:
            if all(isinstance(k, str) and not isinstance(k, Enum) and not k.startswith("$") for k in v):
                return {k: self.run(x, f"{at}/{k}") for k, x in v.items()}
            return {"$dict": [[self.run(k, at), self.run(x, f"{at}/{k}")] for k, x in v.items()]}
        if type(v) is collections.OrderedDict:  # a torch state_dict, with its _metadata attribute
            return {"$odict": [self.run(dict(v), at), self.run(dict(vars(v)), at)]}
        if type(v) is collections.Counter:
            return {"$counter": [[self.run(k, at), n] for k, n in v.items()]}
        if type(v) is set:
            return {"$set": [self.run(x, at) for x in v]}
        if isinstance(v, np.ndarray):
            if v.dtype.hasobject:
                raise DataError(f"{at or 'the value'}: a numpy array of Python objects is not plain data")
            return {"$array": [v.dtype.str, list(v.shape), base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()]}
        if type(v) is itertools.count:
            return {"$count": [int(x) if x else 1 for x in _COUNT.fullmatch(repr(v)).groups()]}
        if isinstance(v, np.random.Generator):
            return {"$rng": self.run(v.bit_generator.state, at)}
        if self.tensors is not None and _is_tensor(v):
            key = str(len(self.tensors))
            self.tensors[key] = v
            return {"$tensor": [key, _strides(v)]}
        self._ok(type(v), at)
        return self._object(v, at)

    def _object(self, v: Any, at: str) -> dict[str, Any]:
        return {"$obj": [_name(type(v)), {k: self.run(x, f"{at}/{k}") for k, x in _attributes(v).items()}]}

    def _ok(self, cls: Any, at: str) -> None:
        if cls in self.codec._allowed:
            return
        if _name(cls) not in self.codec._by_name:
            raise DataError(f"{at or 'the value'} is a {_name(cls)}, which is not plain data here (store tensors, "
                            "arrays, numbers, strings, lists and dicts)")


class _Decoder:
    def __init__(self, codec: Codec, tensors: Mapping[str, Any] | None) -> None:
        self.codec, self.tensors, self.memo = codec, tensors, []

    def run(self, d: Any) -> Any:
        if isinstance(d, list):
            out: list[Any] = []
            self.memo.append(out)
            out.extend(self.run(x) for x in d)
            return out
        if not isinstance(d, dict):
            return d
        if len(d) != 1 or not next(iter(d)).startswith("$"):
            plain: dict[str, Any] = {}
            self.memo.append(plain)
            plain.update((k, self.run(x)) for k, x in d.items())
            return plain
        ((tag, arg),) = d.items()
        method = getattr(self, "_" + tag[1:], None)
        if method is None:
            raise DataError(f"unknown tag {tag!r} in the data")
        return method(arg)

    def _tuple(self, a: list) -> tuple:
        return tuple(self.run(x) for x in a)

    def _ntuple(self, a: list) -> tuple:
        cls = self.codec.allowed(a[0])
        if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise DataError(f"{a[0]!r} is not a named tuple")
        return cls(*(self.run(x) for x in a[1]))

    def _frozenset(self, a: list) -> frozenset:
        return frozenset(self.run(x) for x in a)

    def _float(self, a: str) -> float:
        if a not in ("nan", "inf", "-inf"):
            raise DataError(f"$float holds {a!r}, not nan, inf or -inf")
        return float(a)

    def _bytes(self, a: str) -> bytes:
        return base64.b64decode(a)

    def _np(self, a: list) -> Any:
        return np.dtype(a[0]).type(self.run(a[1]))

    def _enum(self, a: list) -> Enum:
        return self.codec.allowed(a[0])(self.run(a[1]))

    def _fn(self, a: str) -> Any:
        return self.codec.allowed(a)

    def _ref(self, a: int) -> Any:
        return self.memo[a]

    def _tensor(self, a: list) -> Any:
        key, strides = a
        if self.tensors is None or key not in self.tensors:
            raise DataError(f"the data refers to tensor {key!r}, which the file does not hold")
        t = self.tensors[key]
        if strides is not None:
            import torch

            _check_strides(strides, tuple(t.shape))

            t = torch.empty_strided(t.shape, strides, dtype=t.dtype).copy_(t)
        self.memo.append(t)
        return t

    def _dict(self, a: list) -> dict:
        out: dict[Any, Any] = {}
        self.memo.append(out)
        for k, x in a:
            key = self.run(k)
            out[key] = self.run(x)
        return out

    def _odict(self, a: list) -> collections.OrderedDict:
        out: collections.OrderedDict = collections.OrderedDict()
        self.memo.append(out)
        out.update(self.run(a[0]))
        for k, x in self.run(a[1]).items():
            setattr(out, k, x)
        return out

    def _counter(self, a: list) -> collections.Counter:
        out: collections.Counter = collections.Counter()
        self.memo.append(out)
        for k, n in a:
            out[self.run(k)] = n
        return out

    def _set(self, a: list) -> set:
        out: set[Any] = set()
        self.memo.append(out)
        out.update(self.run(x) for x in a)
        return out

    def _array(self, a: list) -> np.ndarray:
        dtype = np.dtype(a[0])
        if dtype.hasobject:
            raise DataError("a $array of Python objects is not plain data")
        out = np.frombuffer(base64.b64decode(a[2]), dtype=dtype).reshape(a[1]).copy()
        self.memo.append(out)
        return out

    def _count(self, a: list) -> itertools.count:
        out = itertools.count(int(a[0]), int(a[1]))
        self.memo.append(out)
        return out

    def _rng(self, a: Any) -> np.random.Generator:
        slot = len(self.memo)
        self.memo.append(None)
        state = self.run(a)
        kind = _BIT_GENERATORS.get(state.get("bit_generator") if isinstance(state, dict) else None)
        if kind is None:
            raise DataError("a $rng names no numpy bit generator this codec knows")
        bits = kind()
        bits.state = state
        self.memo[slot] = np.random.Generator(bits)
        return self.memo[slot]

    def _obj(self, a: list) -> Any:
        cls = self.codec.allowed(a[0])
        if not isinstance(cls, type) or issubclass(cls, Enum):
            raise DataError(f"{a[0]!r} is not a class whose attributes the data may set")
        obj = cls.__new__(cls)
        self.memo.append(obj)
        for k, x in a[1].items():
            object.__setattr__(obj, k, self.run(x))
        return obj
