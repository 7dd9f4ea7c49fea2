"""Per-entry-point call caches (hand-written): an eager call whose arguments were seen before
replays the launches its first call made, skipping policy selection, checks and launch planning.

An entry point builds one key from its arguments (``tensor_key`` of each tensor: type, shape,
strides, dtype, device, 16-byte alignment of the data pointer, requires_grad; and its Python
options and ``hw``) and looks it up in its ``CallCache``.  On a miss it runs its full path inside
``CallCache.record``, which remembers the Triton launches of that call (direct.py's entries) and
how each tensor argument maps onto the tensors the entry names (inputs, outputs, workspaces);
every other launch argument is a function of the key.  On a hit (``Plan.launch``) the entry
allocates its outputs as its full path does and calls the compiled kernels directly.  Torch ops
of a full path that depend only on the key (allocations, ``zero_``, ``copy_``) are made through
``step``, and replayed in their place among the launches (``Plan.run``).  A call whose launch
Triton could not replay directly, or whose launches used a tensor the entry did not name nor a
step made, records no plan.  Off with direct.py's cache (``POLICY_RUNTIME_DIRECT_LAUNCH=0``,
``direct.enabled``), inside warm-up's compile-only scopes and while a CUDA graph is captured
(``active``).  Each cache holds at most ``LIMIT`` plans, then it is cleared.
"""

from __future__ import annotations

import contextlib
import operator
import threading
from typing import Any, Iterator, Optional

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from . import direct as _direct
from . import launch as _launch

# Plans per entry point before its cache is cleared (a server sees few distinct shapes).
LIMIT = 256

_ALL: list["CallCache"] = []


def tensor_key(t: torch.Tensor) -> tuple:
    """What a plan may depend on of one tensor (never its contents).  Raises AttributeError
    for a non-tensor, so a bad argument misses and meets the full path's check."""
    return (type(t), t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16 == 0, t.requires_grad)


_SCALARS = (type(None), bool, int, float, str)


def arg_key(v: Any) -> Any:
    """The key of one argument: ``tensor_key`` of a tensor, a scalar (None, bool, int, float,
    str) with its type, a tuple or list of those; TypeError for anything else (that call runs its
    full path uncached)."""
    if isinstance(v, torch.Tensor):
        return tensor_key(v)
    if type(v) in _SCALARS:
        return (type(v), v)
    if type(v) in (tuple, list):
        return (type(v), tuple([arg_key(x) for x in v]))
    raise TypeError(f"no call-cache key for {type(v).__name__}")


def scalar_key(v: Any) -> tuple:
    """The key of an option the full path reads on the host (an eps, a head size): a scalar with
    its type; TypeError for anything else, a tensor above all (its key would not hold its
    value, which the plan's launch bakes in), so that call runs its full path uncached."""
    if type(v) in _SCALAR_SET:
        return (type(v), v)
    raise TypeError(f"no call-cache key for an option of type {type(v).__name__}")


def args_key(*vals: Any) -> tuple:
    """``arg_key`` of each value, scalars inline (an entry's options: mostly None or defaults)."""
    scalars = _SCALAR_SET
    return tuple([(type(v), v) if type(v) in scalars else arg_key(v) for v in vals])


_SCALAR_SET = frozenset(_SCALARS)


def lookup(cache: "CallCache", anchor: Any, parts: Any) -> tuple[Any, Optional["Plan"]]:
    """(key, plan) for a call on ``anchor`` whose key is ``parts()``: (None, None) where the
    cache is off or the arguments have no key (the full path runs, its checks raise), (key,
    None) on a miss, (key, NO_PLAN) for a class that launches nothing replayable."""
    try:
        if not active(anchor):
            return None, None
        key = parts()
        return key, cache.plans.get(key)
    except (AttributeError, TypeError):
        return None, None


def active(t: torch.Tensor) -> bool:
    """May this call use a call cache?  Direct launches on, no compile-only scope open, and no
    CUDA graph being captured on ``t``'s device (a captured call takes its workspaces afresh)."""
    if not _direct.ENABLED or _launch.scopes_open():
        return False
    if _direct.RECORDERS and threading.get_ident() in _direct.RECORDERS:
        return False  # inside another entry's recorded call: every launch through direct.launch
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def stream_of(t: torch.Tensor) -> Any:
    """The current stream of ``t``'s device (for keys of plans holding per-stream workspaces)."""
    return torch._C._cuda_getCurrentRawStream(t.get_device()) if t.is_cuda else None


def grad_needed(*tensors: Any) -> bool:
    """Does a tensor among ``tensors`` require grad?  Such a call is never recorded: it raises,
    or (with grad off) runs its full path every time, since grad mode is not in the key."""
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def clear_all() -> None:
    for cache in _ALL:
        cache.plans.clear()


def named(name: str) -> "CallCache":
    """The cache of that name (tests)."""
    return next(cache for cache in _ALL if cache.name == name)


def sizes() -> dict[str, int]:
    return {cache.name: len(cache.plans) for cache in _ALL}


def _shared(tensors: tuple) -> set:
    # The ids of the tensors found at more than one place of ``tensors`` (None is no tensor).
    seen: set = set()
    twice: set = set()
    for t in tensors:
        if t is not None:
            (twice if id(t) in seen else seen).add(id(t))
    return twice


class _Op:
    # A torch op a recorded call made through ``step``: fn(*args, **kwargs) gave ``result``.
    __slots__ = ("fn", "args", "kwargs", "result")

    def __init__(self, fn: Any, args: tuple, kwargs: dict, result: Any):
        self.fn, self.args, self.kwargs, self.result = fn, args, kwargs, result


def step(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``: a torch op of a full path between its launches whose effect
    depends only on the call's key (an allocation of a shape the key gives, ``zero_``, ``copy_``;
    never one reading tensor contents on the host).  A call being recorded remembers it, so that
    its plan makes it again in the same place among the launches, on that call's tensors (keyword
    arguments are constants).  Returns fn's result: a tensor, a tuple of tensors, one of its
    tensor arguments (an in-place op), or a TMA descriptor over its tensor arguments (Triton's
    ``TensorDescriptor``, which a kernel takes in a tensor's place: a plan makes it again on the
    call's tensors)."""
    result = fn(*args, **kwargs)
    if _direct.RECORDERS:
        recording = _direct.RECORDERS.get(threading.get_ident())
        if recording is not None:
            recording.append(_Op(fn, args, kwargs, result))
    return result


class _Step:
    # One launch of a plan: its arguments are the pool (the call's named tensors, then the
    # recorded constants) picked by index.
    __slots__ = ("bound", "pick", "consts")

    def __init__(self, bound: _direct.Bound, pick: Any, consts: tuple):
        self.bound, self.pick, self.consts = bound, pick, consts


class Plan:
    """The launches of one argument class of an entry point.  ``data``: what the entry keeps
    beside them (output shapes, workspaces)."""

    __slots__ = ("steps", "data")

    def __init__(self, steps: tuple[_Step, ...], data: Any):
        self.steps, self.data = steps, data

    def launch(self, tensors: tuple) -> None:
        """The recorded launches with this call's ``tensors`` (named as at the recording)."""
        for step in self.steps:
            step.bound(step.pick(tensors + step.consts))

    def run(self, tensors: tuple) -> list:
        """``launch``, returning the pool: ``tensors``, then the recorded constants, then what
        the plan's steps made (a ``_PoolPlan``'s; here none)."""
        self.launch(tensors)
        return list(tensors)


def _picker(refs: list) -> Any:
    # pool -> the tuple of pool[i] for i in refs.
    if len(refs) > 1:
        return operator.itemgetter(*refs)
    if refs:
        return lambda pool, i=refs[0]: (pool[i],)
    return lambda pool: ()


class _PoolPlan(Plan):
    """A plan with torch ops among its launches (``step``): each op and launch in recorded order
    over one pool of tensors (the call's named tensors, the constants, then each op's products)."""

    __slots__ = ("ops", "consts")

    def __init__(self, ops: tuple, consts: tuple, data: Any):
        super().__init__((), data)
        # Per op: (bound launch or None, pick, torch function, its keyword arguments, products:
        # 0 none (in place), 1 a tensor, 2 a tuple of tensors).
        self.ops, self.consts = ops, consts

    def launch(self, tensors: tuple) -> None:
        self.run(tensors)

    def run(self, tensors: tuple) -> list:
        pool = [*tensors, *self.consts]
        for bound, pick, fn, kwargs, made in self.ops:
            if bound is not None:
                bound(pick(pool))
            elif made == 1:
                pool.append(fn(*pick(pool), **kwargs))
            elif made == 2:
                pool.extend(fn(*pick(pool), **kwargs))
            else:
                fn(*pick(pool), **kwargs)
        return pool


# What an op made through ``step`` may return for a plan to make again.
_PRODUCTS = (torch.Tensor, TensorDescriptor)

# A key whose call launches nothing (a vendor path, an empty problem): its full path runs.
NO_PLAN = Plan((), None)


def _outputs(op: _Op) -> Optional[list]:
    # The tensors an op made (its result, as a list), or None for an in-place op.
    result = op.result
    if result is None or any(result is a for a in op.args):
        return None
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _named_products(op: _Op, where: dict) -> bool:
    # Did the op make only tensors the entry names (which it makes itself on a hit)?
    outs = _outputs(op)
    return outs is not None and bool(outs) and all(id(t) in where for t in outs)


# Allocations a plan replays from a template (commit): fn -> fn_like.
_LIKE = {torch.empty: torch.empty_like, torch.zeros: torch.zeros_like}


def template(t: torch.Tensor) -> torch.Tensor:
    """A one-element tensor with ``t``'s dtype and device, viewed (stride 0) as ``t``'s shape:
    ``new_like`` of it allocates a contiguous tensor like ``t`` for about a third less host time
    than ``torch.empty(shape, dtype=..., device=...)`` (no shape, dtype or device to parse)."""
    return t.new_empty(1).as_strided(t.shape, (0,) * t.dim())


def new_like(tmpl: torch.Tensor) -> torch.Tensor:
    """A new, uninitialized contiguous tensor of ``template``'s shape, dtype and device."""
    return torch.empty_like(tmpl, memory_format=torch.contiguous_format)


class _Unplanned(Exception):
    # A recorded op or launch took a tensor the entry did not name: no plan for the key.
    pass


class _Twice(Exception):
    # A launch took a tensor found at two places of the named ones: no plan, the key left open.
    pass


class _Recording:
    __slots__ = ("launches",)

    def __init__(self) -> None:
        self.launches: list = []


class CallCache:
    """One entry point's plans by key."""

    __slots__ = ("name", "plans")

    def __init__(self, name: str):
        self.name = name
        self.plans: dict[Any, Plan] = {}
        _ALL.append(self)

    @contextlib.contextmanager
    def record(self) -> Iterator[_Recording]:
        """Around a call's full path: its launches are remembered for ``commit``."""
        me = threading.get_ident()
        rec = _Recording()
        _direct.RECORDERS[me] = rec.launches  # active() is False inside: no nested recording
        try:
            yield rec
        finally:
            del _direct.RECORDERS[me]

    def commit(self, rec: _Recording, key: Any, tensors: tuple, data: Any = None, held: bool = False) -> Optional[Plan]:
        """Make ``key``'s plan from the recorded launches, ``tensors`` being every tensor they may
        take (by identity), in the order a hit passes them to ``Plan.launch``.  With ``held``,
        any other tensor is kept in the plan as it is (only for persistent workspaces, whose
        stream is in the key).  None (no plan) where a launch went to Triton or took another
        tensor; ``key`` is then remembered as ``NO_PLAN`` (its full path runs, unrecorded), as
        it is where the call launched nothing.  Ops the call made through ``step`` are replayed in
        their place; one whose products the entry names in ``tensors`` is the entry's own to make
        on a hit, and is left out.  A launch argument found at two places of
        ``tensors`` (the caller passed one tensor as two arguments: the key does not say so, and
        a later call's two tensors would be one) makes no plan and leaves ``key`` unplanned: the
        next call records again."""
        steps = []
        where = {id(t): i for i, t in enumerate(tensors)}
        shared = len(where) < len(tensors) and _shared(tensors)
        events = rec.launches
        if any(type(e) is _Op for e in events):
            events = [e for e in events if not (type(e) is _Op and _named_products(e, where))]
            if any(type(e) is _Op for e in events):
                return self._commit_ops(events, key, tensors, where, shared, data, held)
        for launch in events:
            if launch is None or launch[0] is None:
                return self._none(key)
            entry, grid, args, kwargs, dev = launch
            if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
                return self._none(key)
            consts: list = []
            picks: list[int] = []
            for v in args:
                if isinstance(v, torch.Tensor) and not (held and id(v) not in where):
                    i = where.get(id(v))
                    if i is None or tensors[i] is not v:
                        return self._none(key)
                    if shared and id(v) in shared:
                        return None
                    picks.append(i)
                else:
                    picks.append(len(tensors) + len(consts))
                    consts.append(v)
            steps.append(_Step(_direct.Bound(entry, grid, kwargs, dev), _picker(picks), tuple(consts)))
        if not steps:
            return self._none(key)
        plan = Plan(tuple(steps), data)
        self._put(key, plan)
        return plan

    def _commit_ops(
        self, events: list, key: Any, tensors: tuple, where: dict, shared: Any, data: Any, held: bool
    ) -> Optional[Plan]:
        # commit's plan of a recording with ops: a _PoolPlan.  References are named tensors (an
        # index), then ("c", k) for the k-th constant and ("p", m) for the m-th product,
        # resolved to pool indices at the end.
        n = len(tensors)
        consts: list = []
        made: dict[int, tuple] = {}  # id of a product (alive in rec) -> its reference
        raw: list[tuple] = []

        def ref(v: Any) -> Any:
            r = made.get(id(v))  # a product of an op (a tensor, or a descriptor over one)
            if r is not None:
                return r
            if isinstance(v, torch.Tensor) and not (held and id(v) not in where):
                i = where.get(id(v))
                if i is None or tensors[i] is not v:
                    raise _Unplanned
                if shared and id(v) in shared:
                    raise _Twice
                return i
            consts.append(v)
            return ("c", len(consts) - 1)

        try:
            for event in events:
                if event is None or (type(event) is not _Op and event[0] is None):
                    return self._none(key)
                if type(event) is _Op:
                    if any(isinstance(v, torch.Tensor) for v in event.kwargs.values()):
                        return self._none(key)
                    result = event.result
                    outs = _outputs(event)
                    if outs is None:
                        products = 0  # in place: nothing, or one of its arguments, returned
                    elif all(isinstance(t, _PRODUCTS) and id(t) not in where for t in outs):
                        products = 2 if isinstance(result, (tuple, list)) else 1
                    else:
                        return self._none(key)
                    tensors_out = outs or ()
                    like = _LIKE.get(event.fn) if products == 1 else None
                    if like is not None and result.is_contiguous():
                        # An allocation: replayed as fn_like of its template (``template``).
                        consts.append(template(result))
                        fn, refs, kwargs = like, [("c", len(consts) - 1)], {"memory_format": torch.contiguous_format}
                    else:
                        fn, refs, kwargs = event.fn, [ref(v) for v in event.args], dict(event.kwargs)
                    for t in tensors_out if products else ():
                        made[id(t)] = ("p", len(made))
                    raw.append((None, refs, fn, kwargs, products))
                    continue
                entry, grid, args, kwargs, dev = event
                if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
                    return self._none(key)
                raw.append((_direct.Bound(entry, grid, kwargs, dev), [ref(v) for v in args], None, None, 0))
        except _Unplanned:
            return self._none(key)
        except _Twice:
            return None
        if not any(bound is not None for bound, *_ in raw):
            return self._none(key)
        base = {"c": n, "p": n + len(consts)}

        def index(r: Any) -> int:
            return r if type(r) is int else base[r[0]] + r[1]

        ops = tuple(
            (bound, _picker([index(r) for r in refs]), fn, kwargs, products)
            for bound, refs, fn, kwargs, products in raw
        )
        plan = _PoolPlan(ops, tuple(consts), data)
        self._put(key, plan)
        return plan

    def _none(self, key: Any) -> Optional[Plan]:
        # No plan for ``key``: remembered as NO_PLAN (its full path runs, unrecorded).
        self._put(key, NO_PLAN)
        return None

    def _put(self, key: Any, plan: Plan) -> None:
        if len(self.plans) >= LIMIT:
            self.plans.clear()
        self.plans[key] = plan
