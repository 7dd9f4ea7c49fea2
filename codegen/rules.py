"""The rule language: small, side-effect-free Python expressions in specs.

Policies state derived parameters as expressions evaluated against each
target, e.g. ``triton_block_n * model.head_dim * dtype_bytes * 2 <=
hw.max_shared_memory_per_block``.  Expressions are parsed with ``ast`` and
walked by this module; nothing is ever passed to ``eval``.

Allowed: int/float/bool/str constants; names; attribute access on the
``hw`` and ``model`` namespaces; ``+ - * / // % **``; unary ``- + not``;
``and``/``or``; comparison chains; ``a if c else b``; calls of the functions
in ``FUNCTIONS``.  Anything else is rejected when the spec is loaded, so a
malformed rule is reported with its file and key before resolution starts;
so is an expression nested deeper than ``MAX_DEPTH`` (parsing, evaluating or
explaining it would exhaust Python's recursion limit).
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping


class RuleError(Exception):
    """A rule failed to parse or evaluate; the message says why, in words."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _clamp(x: Any, lo: Any, hi: Any) -> Any:
    return max(lo, min(hi, x))


def _pow2_floor(x: int) -> int:
    if x < 1:
        raise RuleError(f"pow2_floor needs a positive argument, got {x}")
    return 1 << (int(x).bit_length() - 1)


def _pow2_ceil(x: int) -> int:
    if x < 1:
        raise RuleError(f"pow2_ceil needs a positive argument, got {x}")
    return 1 << (int(x) - 1).bit_length()


# Functions a rule may call.  Pure, total on their documented domain.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "ceil_div": _ceil_div,
    "clamp": _clamp,
    "pow2_floor": _pow2_floor,
    "pow2_ceil": _pow2_ceil,
    "log2": lambda x: math.log2(x),
    "int": int,
}

# The most bits an integer power may have.  Spec numbers are sizes and counts; a larger
# power (2 ** 10 ** 10) is a typo that would take the build minutes and gigabytes.
MAX_POW_BITS = 256
# Bounds on every intermediate value, so that no rule can take unbounded time or memory: an
# integer of at most MAX_INT_BITS bits, a string of at most MAX_STR_LEN characters.
MAX_INT_BITS = 2 * MAX_POW_BITS
MAX_STR_LEN = 1000


def _cut(text: str, limit: int = 80) -> str:
    """Rule text quoted in a message, cut to ``limit`` characters with the count left out."""
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text) - limit + 3:,} more characters)"


def _pow(base: Any, exp: Any) -> Any:
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1:
        if exp * (abs(base).bit_length() - 1) > MAX_POW_BITS:
            raise RuleError(f"{base} ** {exp:,} is too large (more than {MAX_POW_BITS} bits)")
    return operator.pow(base, exp)


def _mul(a: Any, b: Any) -> Any:
    if isinstance(a, str) or isinstance(b, str):  # 'x' * 10 ** 9 would be a gigabyte string
        raise RuleError("strings cannot be multiplied in a rule")
    return operator.mul(a, b)


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _pow,
}
_CMPOPS: dict[type, tuple[Callable[[Any, Any], bool], str]] = {
    ast.Lt: (operator.lt, "<"),
    ast.LtE: (operator.le, "<="),
    ast.Gt: (operator.gt, ">"),
    ast.GtE: (operator.ge, ">="),
    ast.Eq: (operator.eq, "=="),
    ast.NotEq: (operator.ne, "!="),
}
# Names that are namespaces: ``hw.sm_count``, ``model.head_dim``.
NAMESPACES = ("hw", "model")
# Deepest syntax tree a rule may have.  Evaluation recurses once or twice per level, so this
# keeps far below Python's recursion limit; real rules are a dozen levels deep.
MAX_DEPTH = 100


@dataclass(frozen=True)
class Expr:
    """A parsed rule.  ``names`` are the free (non-namespace) names it reads."""

    source: str
    tree: ast.Expression
    names: frozenset[str]
    attrs: frozenset[tuple[str, str]]  # (namespace, attribute) pairs it reads

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"


def parse(source: str) -> Expr:
    """Parse and vet ``source``; raise RuleError naming the first offending construct."""
    if not isinstance(source, str) or not source.strip():
        raise RuleError("a rule must be a non-empty expression string")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise RuleError(f"not a valid expression: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise RuleError(f"expression too deeply nested or too large (at most {MAX_DEPTH} levels)") from None
    if _depth(tree) > MAX_DEPTH:
        raise RuleError(f"expression too deeply nested (at most {MAX_DEPTH} levels)")
    names: set[str] = set()
    attrs: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if not (isinstance(node.value, ast.Name) and node.value.id in NAMESPACES):
                raise RuleError(f"attribute access is only allowed on {', '.join(NAMESPACES)}")
            attrs.add((node.value.id, node.attr))
        elif isinstance(node, ast.Name):
            if node.id in FUNCTIONS or node.id in NAMESPACES:
                continue
            names.add(node.id)
        elif isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS) or node.keywords:
                raise RuleError(f"only calls of {', '.join(sorted(FUNCTIONS))} with positional arguments are allowed")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool)):
                raise RuleError(f"constant {_cut(repr(node.value))} is not allowed")
            if type(node.value) is int and node.value.bit_length() > MAX_INT_BITS:
                raise RuleError(f"a constant of {node.value.bit_length():,} bits (more than {MAX_INT_BITS} bits)")
            if isinstance(node.value, str) and len(node.value) > MAX_STR_LEN:
                raise RuleError(f"a string constant of {len(node.value):,} characters (more than {MAX_STR_LEN:,})")
        elif isinstance(node, ast.BinOp) and type(node.op) not in _BINOPS:
            raise RuleError(f"operator {type(node.op).__name__} is not allowed")
        elif isinstance(node, ast.Compare) and any(type(op) not in _CMPOPS for op in node.ops):
            raise RuleError("only < <= > >= == != comparisons are allowed")
        elif not isinstance(
            node,
            (
                ast.Expression,
                ast.BinOp,
                ast.UnaryOp,
                ast.BoolOp,
                ast.Compare,
                ast.IfExp,
                ast.Load,
                ast.operator,
                ast.unaryop,
                ast.boolop,
                ast.cmpop,
            ),
        ):
            raise RuleError(f"{type(node).__name__} is not allowed in a rule")
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            raise RuleError(f"operator {type(node.op).__name__} is not allowed")
    return Expr(source=source.strip(), tree=tree, names=frozenset(names), attrs=frozenset(attrs))


def _depth(tree: ast.AST) -> int:
    """Depth of a syntax tree, found without recursion."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


class Env:
    """What a rule can see: a name lookup and namespaces (mappings of attributes)."""

    def __init__(
        self,
        lookup: Callable[[str], Any],
        namespaces: Mapping[str, Mapping[str, Any]],
        labels: Mapping[str, str] | None = None,
    ):
        self.lookup = lookup
        self.namespaces = namespaces
        # What a namespace stands for, for messages ("model llama31_8b (specs/models/...)").
        self.labels = labels or {}

    def attr(self, ns: str, name: str) -> Any:
        space = self.namespaces.get(ns)
        if space is None:
            raise RuleError(f"'{ns}' is not available here")
        if name not in space:
            label = self.labels.get(ns)
            if label is not None:
                raise RuleError(
                    f"the rule reads '{ns}.{name}', which {label} does not set (it sets: {', '.join(sorted(space))})"
                )
            raise RuleError(f"'{ns}.{name}' is not defined (known: {', '.join(sorted(space))})")
        return space[name]


def evaluate(expr: Expr, env: Env) -> Any:
    try:
        return _compiled(expr.tree.body)(env)
    except RuleError:
        raise
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise RuleError(f"evaluating '{_cut(expr.source)}' failed: {exc}") from None


def _eval(node: ast.AST, env: Env) -> Any:
    return _bounded(_eval_node(node, env), node)


def _bounded(value: Any, node: ast.AST) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise RuleError(f"'{_cut(ast.unparse(node))}' gives an integer of more than {MAX_INT_BITS} bits")
    if isinstance(value, str) and len(value) > MAX_STR_LEN:
        raise RuleError(f"'{_cut(ast.unparse(node))}' gives a string of more than {MAX_STR_LEN:,} characters")
    return value


def _eval_node(node: ast.AST, env: Env) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            raise RuleError(f"'{node.id}' is a function; call it")
        return env.lookup(node.id)
    if isinstance(node, ast.Attribute):
        return env.attr(node.value.id, node.attr)  # type: ignore[attr-defined]
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not value
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for sub in node.values:
                result = _eval(sub, env)
                if not result:
                    return result
            return result
        result = False
        for sub in node.values:
            result = _eval(sub, env)
            if result:
                return result
        return result
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _CMPOPS[type(op)][0](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, ast.Call):
        args = [_eval(a, env) for a in node.args]
        return FUNCTIONS[node.func.id](*args)  # type: ignore[attr-defined]
    raise RuleError(f"{type(node).__name__} is not allowed in a rule")  # parse() vets this


# evaluate() runs a rule as nested closures made once per syntax tree (id -> (node, closure);
# the node is kept so that its id is not reused): the same steps, in the same order and with
# the same bounds and messages as _eval, which walking the tree on every evaluation repeated
# (resolving the whole spec tree evaluates some 40,000 nodes).  _eval stays for explanations.
_COMPILED: dict[int, tuple[ast.AST, Callable[[Env], Any]]] = {}


def _compiled(node: ast.AST) -> Callable[[Env], Any]:
    entry = _COMPILED.get(id(node))
    if entry is None or entry[0] is not node:
        entry = (node, _compile(node))
        _COMPILED[id(node)] = entry
    return entry[1]


def _compile(node: ast.AST) -> Callable[[Env], Any]:
    """``_eval(node, env)`` as a function of ``env``."""
    inner = _compile_node(node)
    if isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        # A bool, or (BoolOp) one of its operands' values, which were bounded already.
        return inner

    def bounded(env: Env) -> Any:
        return _bounded(inner(env), node)

    return bounded


def _compile_node(node: ast.AST) -> Callable[[Env], Any]:  # noqa: C901 - one branch per node type
    """``_eval_node(node, env)`` as a function of ``env``."""
    if isinstance(node, ast.Constant):
        value = node.value
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        if name in FUNCTIONS:

            def function_name(env: Env) -> Any:
                raise RuleError(f"'{name}' is a function; call it")

            return function_name
        return lambda env: env.lookup(name)
    if isinstance(node, ast.Attribute):
        ns, attr = node.value.id, node.attr  # type: ignore[attr-defined]
        return lambda env: env.attr(ns, attr)
    if isinstance(node, ast.BinOp):
        op, left, right = _BINOPS[type(node.op)], _compile(node.left), _compile(node.right)
        return lambda env: op(left(env), right(env))
    if isinstance(node, ast.UnaryOp):
        operand = _compile(node.operand)
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        if isinstance(node.op, ast.USub):
            return lambda env: -operand(env)
        return lambda env: +operand(env)
    if isinstance(node, ast.BoolOp):
        subs = [_compile(sub) for sub in node.values]
        if isinstance(node.op, ast.And):

            def all_of(env: Env) -> Any:
                result: Any = True
                for sub in subs:
                    result = sub(env)
                    if not result:
                        return result
                return result

            return all_of

        def any_of(env: Env) -> Any:
            result: Any = False
            for sub in subs:
                result = sub(env)
                if result:
                    return result
            return result

        return any_of
    if isinstance(node, ast.Compare):
        first = _compile(node.left)
        steps = [(_CMPOPS[type(op)][0], _compile(comp)) for op, comp in zip(node.ops, node.comparators)]

        def compare(env: Env) -> bool:
            left = first(env)
            for fn, comp in steps:
                right = comp(env)
                if not fn(left, right):
                    return False
                left = right
            return True

        return compare
    if isinstance(node, ast.IfExp):
        test, body, orelse = _compile(node.test), _compile(node.body), _compile(node.orelse)
        return lambda env: body(env) if test(env) else orelse(env)
    if isinstance(node, ast.Call):
        fn, args = FUNCTIONS[node.func.id], [_compile(a) for a in node.args]  # type: ignore[attr-defined]
        return lambda env: fn(*[a(env) for a in args])
    kind = type(node).__name__

    def not_allowed(env: Env) -> Any:
        raise RuleError(f"{kind} is not allowed in a rule")  # parse() vets this

    return not_allowed


def explain_failure(expr: Expr, env: Env) -> str:
    """Say why a boolean rule is false: the failing comparison with both sides' values.

    ``a * b <= c`` becomes ``a * b = 131,072 > c = 49,152``.  Falls back to the
    source text when the false part is not a comparison.
    """
    node = _failing_node(expr.tree.body, env)
    if isinstance(node, ast.Compare):
        left_node = node.left
        left = _eval(left_node, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            fn, symbol = _CMPOPS[type(op)]
            if not fn(left, right):
                negated = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}[symbol]
                return f"{_show(left_node, left)} {negated} {_show(comp, right)}"
            left_node, left = comp, right
    return f"'{_cut(ast.unparse(node))}' is false"


def explain_holds(expr: Expr, env: Env) -> str:
    """The numbers of a rule that holds, where it is one comparison: ``a * b = 98,304 <= c =
    101,376``; else its source text."""
    node = expr.tree.body
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right = _eval(node.left, env), _eval(node.comparators[0], env)
        return f"{_show(node.left, left)} {_CMPOPS[type(node.ops[0])][1]} {_show(node.comparators[0], right)}"
    return f"'{_cut(expr.source)}'"


def _failing_node(node: ast.AST, env: Env) -> ast.AST:
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        for sub in node.values:
            if not _eval(sub, env):
                return _failing_node(sub, env)
    return node


def _show(node: ast.AST, value: Any) -> str:
    text = _cut(ast.unparse(node))
    shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)
    return shown if isinstance(node, ast.Constant) else f"{text} = {shown}"
