"""Workloads: a train-step function with abstract, optionally named, arguments."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ._errors import ModelFileError, WorkloadError
from ._hardware import hardware
from ._ir import base_name, name_size


class Spec(jax.ShapeDtypeStruct):
    """A ``jax.ShapeDtypeStruct`` whose axes carry dim names (``None`` for an unnamed axis)."""

    __slots__ = ("dims",)

    def __init__(self, shape: Sequence[int], dtype: Any, dims: Sequence[str | None]):
        super().__init__(tuple(shape), dtype)
        self.dims = tuple(dims)

    def __repr__(self) -> str:
        return f"spec({self.shape}, {self.dims}, {self.dtype})"


def spec(shape: Sequence[int], dims: Sequence[str | None], dtype: Any = jnp.float32) -> Spec:
    """An abstract array whose axes carry names.

    Args:
      shape: the array's shape.
      dims: one name per axis (``None`` leaves an axis to be named by the tracer).
      dtype: the element type.

    Example:
      >>> import autolayout as al
      >>> w = al.spec((512, 2048), ("d_model", "d_ff"))
      >>> w.shape, w.dims
      ((512, 2048), ('d_model', 'd_ff'))
    """
    shape = tuple(shape)
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    if not all(isinstance(s, int) and s >= 0 for s in shape):
        raise WorkloadError(f"spec shape must be non-negative ints, got {shape}")
    if len(dims) != len(shape):
        raise WorkloadError(
            f"spec{shape} has {len(shape)} axes but {len(dims)} dim names {dims}; give one name per axis (None to leave one unnamed)"
        )
    named = [d for d in dims if d is not None]
    for d in named:
        if not isinstance(d, str) or not d:
            raise WorkloadError(
                f"spec{shape}: dim names must be non-empty strings or None, got {d!r}"
            )
    bases = [base_name(d) for d in named]
    dup = sorted({d for d in bases if bases.count(d) > 1})
    if dup:
        raise WorkloadError(
            f"spec{shape} names dim {dup[0]!r} on two axes {dims}; axes of one array need distinct names"
        )
    _check_sizes(f"spec{shape}", dims, shape)
    return Spec(shape, dtype, dims)


def _check_sizes(what: str, dims: Sequence[str | None], shape: Sequence[int]) -> None:
    """A name written with its size (``kd(3)``: Mesh-TF's dim of name ``kd`` and size 3, as
    autolayout shows it where ``kd`` has two sizes) must be on an axis of that size."""
    for d, n in zip(dims, shape, strict=True):
        stated = None if d is None else name_size(d)
        if stated is not None and stated != n:
            raise WorkloadError(
                f"{what}: dim {d!r} names size {stated} but its axis has size {n}; name it "
                f"{base_name(d)!r} (a dim is a name and a size: one name may have several sizes)"
            )


_NAME_PREFIX = "autolayout:"


def name_dims(x: jax.Array, dims: Sequence[str | None]) -> jax.Array:
    """Names the axes of an intermediate array inside a step (identity at run time).

    Mesh-TF names every dim; the tracer infers most, but an axis born inside the step (an
    MoE's expert-capacity slots from ``one_hot``, a downsampled volume) otherwise gets a
    name from the op that made it. This puts the name on, through ``checkpoint_name``.

    Example:
      >>> import autolayout as al, jax.numpy as jnp
      >>> al.name_dims(jnp.zeros((2, 3)), ("batch", "capacity")).shape
      (2, 3)
    """
    dims = tuple(dims)
    if len(dims) != x.ndim:
        raise WorkloadError(f"name_dims: array has {x.ndim} axes but {len(dims)} names {dims}")
    for d in dims:
        if d is not None and (not isinstance(d, str) or not d or "," in d):
            raise WorkloadError(
                f"name_dims: dim names must be non-empty strings without commas, got {d!r}"
            )
    named = [base_name(d) for d in dims if d is not None]
    if len(set(named)) != len(named):
        raise WorkloadError(f"name_dims: {dims} names one dim twice")
    _check_sizes("name_dims", dims, x.shape)
    return checkpoint_name(x, _NAME_PREFIX + ",".join(d or "" for d in dims))


def parse_name_dims(name: str) -> tuple[str | None, ...] | None:
    """The dims a ``name`` equation carries, or None for a name that is not ours."""
    if not name.startswith(_NAME_PREFIX):
        return None
    return tuple(d or None for d in name[len(_NAME_PREFIX) :].split(","))


def _abstract(path: str, leaf: Any) -> jax.ShapeDtypeStruct:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype)
    raise WorkloadError(
        f"workload argument {path} is a {type(leaf).__name__}, expected al.spec(...) or jax.ShapeDtypeStruct"
    )


def path_str(path: tuple[Any, ...], argnames: Sequence[str] = ()) -> str:
    """``(SequenceKey(0), DictKey('wq'))`` -> ``"params/wq"`` (argument names from the signature)."""
    parts: list[str] = []
    for i, k in enumerate(path):
        if isinstance(k, jax.tree_util.SequenceKey):
            if i == 0 and k.idx < len(argnames):
                parts.append(argnames[k.idx])
            else:
                parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            parts.append(k.name)
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        else:
            parts.append(str(k))
    return "/".join(parts)


def _argnames(fn: Callable[..., Any], n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [f"arg{i}" for i in range(n)]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return (names + [f"arg{i}" for i in range(len(names), n)])[:n]


@dataclass(frozen=True)
class Workload:
    """A whole training step, ``fn(*args)``, over abstract arguments.

    Args:
      fn: the step: forward, backward and optimizer update.
      args: its arguments as pytrees of ``al.spec`` / ``jax.ShapeDtypeStruct`` (never real
        arrays, so planning a 175B-parameter model allocates nothing).
      donate_argnums: arguments whose buffers the step may reuse (its state).
      name: shown in reports.
      init: optional ``init(seed) -> args`` that builds real arguments of the same shapes,
        for running the workload.
      init_state: optional ``init_state(key) -> (the donated arguments)``, jittable (built
        with ``jax.random``): ``autolayout run`` makes the state in its planned sharding.
      batches: optional ``batches(step, seed) -> (the other arguments)`` as host arrays, the
        same on every process (each process feeds its own shards of them).
      options: the options the model file's ``workload()`` was called with.

    Example:
      >>> import autolayout as al, jax.numpy as jnp
      >>> wl = al.Workload(lambda w, x: jnp.sum(x @ w), (al.spec((4, 8), ("d_in", "d_out")),
      ...                  al.spec((2, 4), ("batch", "d_in"))), name="tiny")
      >>> wl.argnames
      ('w', 'x')
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    donate_argnums: tuple[int, ...] = ()
    name: str = ""
    init: Callable[[int], tuple[Any, ...]] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    init_state: Callable[[Any], tuple[Any, ...]] | None = None
    batches: Callable[[int, int], tuple[Any, ...]] | None = None

    def __init__(
        self, fn, args, *, donate_argnums=(), name="", init=None, options=None,
        init_state=None, batches=None,
    ):  # fmt: skip
        if not callable(fn):
            raise WorkloadError(f"Workload fn must be callable, got {type(fn).__name__}")
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        names = _argnames(fn, len(args))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(args)
        abstract = [_abstract(path_str(p, names), leaf) for p, leaf in leaves]
        args = jax.tree_util.tree_unflatten(treedef, abstract)
        donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
        for i in donate:
            if not 0 <= i < len(args):
                raise WorkloadError(
                    f"donate_argnums has {i}, but the step takes {len(args)} arguments"
                )
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "donate_argnums", donate)
        object.__setattr__(self, "name", name or getattr(fn, "__name__", "workload"))
        object.__setattr__(self, "init", init)
        object.__setattr__(self, "options", dict(options or {}))
        object.__setattr__(self, "init_state", init_state)
        object.__setattr__(self, "batches", batches)

    @property
    def argnames(self) -> tuple[str, ...]:
        return tuple(_argnames(self.fn, len(self.args)))


_TARGET: list[str | None] = [None]  # the kind of hardware a model is being loaded for
KINDS = ("gpu", "tpu", "cpu")
_TARGET_READS = [0]  # calls of target(): whether a model file asked while it was loaded


def target() -> str:
    """The kind of chip (``"gpu"``, ``"tpu"`` or ``"cpu"``) the step is being built for: the
    ``target`` given to :func:`load_workload` (``autolayout plan --hw`` gives its profile's),
    else the devices this process runs on. A model file reads it to pick what that hardware
    runs, e.g. fused attention on accelerators and the einsum composition on a CPU::

        impl = "cudnn" if al.target() == "gpu" else "xla"
    """
    _TARGET_READS[0] += 1
    if _TARGET[0] is not None:
        return _TARGET[0]
    backend = jax.default_backend()
    return "gpu" if backend in ("gpu", "cuda", "rocm") else backend if backend in KINDS else "cpu"


def _asked(reads: int) -> str | None:
    """What :func:`target` answered, where it was asked since ``reads`` calls."""
    return target() if _TARGET_READS[0] > reads else None


def _target_kind(target: Any) -> str:
    """A kind from a kind, a profile name or a ``Hardware``."""
    if isinstance(target, str) and target in KINDS:
        return target
    if isinstance(target, str):  # a profile name or file
        target = hardware(target)
    kind = getattr(target, "kind", None)
    if kind not in KINDS:
        raise WorkloadError(
            f"target must be 'gpu', 'tpu', 'cpu', a hardware profile or its name, got {target!r}"
        )
    return kind


def load_workload(path: str | Path, *, target: Any = None, **options: Any) -> Workload:
    """Imports a model file and calls its ``workload(**options)``.

    ``target``: the hardware the model is loaded for (a profile name such as ``"h100-64"``, a
    ``Hardware``, or ``"gpu"``/``"tpu"``/``"cpu"``); what :func:`target` answers while the
    model file builds its step (default: this process's devices).

    Raises :class:`ModelFileError` (one line, naming the file) when the file does not exist,
    cannot be imported, defines no ``workload``, raises, or returns something else.

    Example:
      >>> import autolayout as al
      >>> wl = al.load_workload("experiments/models/mlp.py", size="tiny")  # doctest: +SKIP
    """
    kind = None if target is None else _target_kind(target)
    p = Path(path)
    if not p.is_file():
        raise ModelFileError(f"model file {str(path)!r} does not exist")
    modname = f"_autolayout_model_{abs(hash(str(p.resolve())))}"
    mspec = importlib.util.spec_from_file_location(modname, p)
    if mspec is None or mspec.loader is None:
        raise ModelFileError(f"{path}: not a Python file that can be imported")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[modname] = module
    folder = str(p.resolve().parent)  # as `python model.py` would: its folder's modules import
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        mspec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[modname]
        raise ModelFileError(
            f"{path}: importing the model file raised {type(e).__name__}: {e}"
        ) from e
    finally:
        if added:
            sys.path.remove(folder)
    fn = getattr(module, "workload", None)
    if not callable(fn):
        raise ModelFileError(
            f"{path} defines no workload() function; a model file must define workload(**options) -> al.Workload"
        )
    options = typed_options(fn, options, str(path))
    saved, _TARGET[0] = _TARGET[0], kind
    reads = _TARGET_READS[0]
    try:
        wl = fn(**options)
        loaded_for = _asked(reads)
    except Exception as e:
        shown = ", ".join(f"{k}={v!r}" for k, v in options.items())
        raise ModelFileError(f"{path}: workload({shown}) raised {type(e).__name__}: {e}") from e
    finally:
        _TARGET[0] = saved
    if not isinstance(wl, Workload):
        raise ModelFileError(
            f"{path}: workload() returned {type(wl).__name__}, expected al.Workload"
        )
    if not wl.options:
        object.__setattr__(wl, "options", dict(options))
    for name, value in options.items():  # a number the model rounded (int(2.5) layers)
        used = wl.options.get(name, value)
        number = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (value, used))
        if number and used != value:
            raise ModelFileError(
                f"{path}: option {name}={value!r} refused: workload() made it {used!r}; give "
                f"{name} as {'a whole number' if isinstance(used, int) else 'a number'}"
            )
    object.__setattr__(wl, "loaded_for", loaded_for)
    if not wl.name or getattr(wl, "name_by_default", False):  # not named: after its file
        object.__setattr__(wl, "name", p.stem)
    return wl


_SCALARS = (bool, int, float, str)


def _option_types(fn: Callable[..., Any]) -> tuple[dict[str, Any], Any, bool]:
    """``workload()``'s options: {name: the type its values must have (an annotation, else the
    type of its default; ``None`` where neither says)}, the type of ``**options`` (its
    annotation, or ``None``), and whether it takes ``**options`` at all."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: fall back on the defaults
        hints = {}
    kinds, rest, takes_rest = {}, None, False
    for name, prm in sig.parameters.items():
        if prm.kind is prm.VAR_KEYWORD:
            takes_rest, rest = True, hints.get(name)
        elif prm.kind in (prm.POSITIONAL_OR_KEYWORD, prm.KEYWORD_ONLY):
            default = prm.default
            guess = type(default) if isinstance(default, _SCALARS) else None
            kinds[name] = hints.get(name, guess)
    return kinds, rest, takes_rest


def _typed(value: Any, kind: Any) -> tuple[bool, Any]:
    """(whether ``value`` is a ``kind``, the value as one): an int is a float, a number
    given on the command line (``--set size=256``) is the text of a ``str`` option; a
    ``Literal`` is one of its values; unions and ``X | None`` try each."""
    if kind is None or kind is Any:
        return True, value
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return value in typing.get_args(kind), value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(kind)
        for exact in (True, False):  # the value's own type first: 2 stays an int in int | str
            for arg in args:
                if exact and not (isinstance(arg, type) and type(value) is arg):
                    continue
                ok, v = _typed(value, arg)
                if ok:
                    return True, v
        return False, value
    if kind is type(None):
        return value is None, value
    if kind is bool:
        return isinstance(value, bool), value
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if kind is float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number, float(value) if number else value
    if kind is str:
        if isinstance(value, str):
            return True, value
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number, str(value) if number else value
    return True, value  # a type of the model's own: the model checks it


def _kind_text(kind: Any) -> str:
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}
    if kind in names:
        return names[kind]
    if typing.get_origin(kind) is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(kind)))
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        text = " or ".join(_kind_text(a) for a in args)
        return text + (" or None" if len(args) < len(typing.get_args(kind)) else "")
    return getattr(kind, "__name__", str(kind))


def typed_options(fn: Callable[..., Any], options: dict[str, Any], source: str) -> dict[str, Any]:
    """``options`` typed by ``fn``'s signature (a model file's ``workload``): each checked
    against its annotation, else the type of its default, so model files written without
    annotations are typed too; ``**options`` by their annotation where there is one. Raises
    :class:`ModelFileError`, one line naming the option, what it must be and the default.

    Example:
      >>> def workload(layers: int = 2, scan=False): ...
      >>> typed_options(workload, {"layers": 4, "scan": True}, "m.py")
      {'layers': 4, 'scan': True}
    """
    try:
        kinds, rest, takes_rest = _option_types(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): as given
        return dict(options)
    params = inspect.signature(fn).parameters
    out = {}
    for name, value in options.items():
        if name not in kinds and not takes_rest:
            out[name] = value  # the call says so: "got an unexpected keyword argument"
            continue
        kind = kinds.get(name, rest)
        ok, typed = _typed(value, kind)
        if not ok:
            prm = params.get(name)
            default = (
                f" (default {prm.default!r})"
                if prm is not None and prm.default is not inspect.Parameter.empty
                else ""
            )
            raise ModelFileError(
                f"{source}: option {name}={value!r} refused: workload() takes {name} as "
                f"{_kind_text(kind)}{default}"
            )
        out[name] = typed
    return out


def target_mismatch(wl: Workload, kind: str) -> str | None:
    """One line when ``wl``'s model file built its step for another kind of chip (it read
    :func:`target`) than the hardware it is priced on, else ``None``."""
    loaded = getattr(wl, "loaded_for", None)
    if loaded is None or loaded == kind:
        return None
    return (
        f"{wl.name} was built for {loaded} devices (its model file asked al.target()) and is "
        f"priced on {kind}: load it with al.load_workload(..., target=<the hardware>) to "
        f"trace what that hardware runs"
    )
