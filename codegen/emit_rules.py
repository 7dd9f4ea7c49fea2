"""A config's rules as Python: one plain function per policy, for generated/dispatch.py.

The build evaluates every rule for the named targets and models (``resolve``); a seed-style
selector called with other dimensions, or with a hardware record built by hand, needs the same
rules at run time.  This module turns one policy's values, the config's derived values and its
checks into the statements of a function of ``hw`` (any record with the hardware attributes the
rules read), the variant's parameters and the model dimensions the rules read (``model_<dim>``).
Each statement carries the spec line it came from.  The functions call nothing but builtins and
``policy_runtime.rule_functions`` (imported as ``_rules``), so the generated module needs no
compiler at run time.

The statements are data (``[{"indent", "code", "comment"}]``); templates lay them out.
"""

from __future__ import annotations

import ast
import string
from dataclasses import dataclass
from typing import Any

from . import rules
from .records import Config, ExprValue, LiteralValue, PickValue, Policy

# Rule functions that are not Python builtins: policy_runtime.rule_functions defines them.
_RUNTIME_FUNCTIONS = ("ceil_div", "clamp", "pow2_floor", "pow2_ceil", "log2")


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[str, ...]  # variant parameters, in the config's order
    model_dims: tuple[str, ...]  # model dimensions read (argument model_<dim>)
    statements: tuple[dict[str, Any], ...]


def _rename(node: ast.AST) -> ast.AST:
    """``model.<dim>`` as the argument ``model_<dim>``; the rule language's own functions as
    ``_rules.<name>`` (children first, in place)."""
    for field, value in ast.iter_fields(node):
        if isinstance(value, list):
            setattr(node, field, [_rename(v) if isinstance(v, ast.AST) else v for v in value])
        elif isinstance(value, ast.AST):
            setattr(node, field, _rename(value))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "model":
        return ast.copy_location(ast.Name(id=f"model_{node.attr}", ctx=ast.Load()), node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _RUNTIME_FUNCTIONS:
        node.func = ast.Attribute(value=ast.Name(id="_rules", ctx=ast.Load()), attr=node.func.id, ctx=ast.Load())
    return node


def python(expr: rules.Expr) -> str:
    """The rule as a Python expression over the function's locals."""
    tree = _rename(ast.parse(expr.source.strip(), mode="eval"))
    return ast.unparse(ast.fix_missing_locations(tree))


def model_dims_read(cfg: Config, policies: list[Policy]) -> tuple[str, ...]:
    exprs = list(cfg.derived.values()) + [c.rule for c in cfg.checks] + [c.when for c in cfg.checks if c.when]
    for pol in policies:
        for v in pol.values.values():
            if isinstance(v, ExprValue):
                exprs.append(v.expr)
            elif isinstance(v, PickValue):
                exprs.append(v.where)
    return tuple(sorted({attr for e in exprs for ns, attr in e.attrs if ns == "model"}))


def function_name(cfg: Config, policy: Policy) -> str:
    if policy.vendor is None:
        tag = "base"
    else:
        tag = f"{policy.vendor}_{policy.min_arch}"
        tag += f"_to_{policy.max_arch}" if policy.max_arch is not None else ""
        tag += "".join(f"_{t}" for t in policy.targets or ())
    return f"_{cfg.name}_rules_{tag}"


def emit(cfg: Config, policy: Policy, params: tuple[str, ...], model_dims: tuple[str, ...]) -> Function:
    """The function computing ``cfg``'s record under ``policy``; raises ValueError (through
    ``_rules.check_failed``) where a check fails."""
    out: list[dict[str, Any]] = []
    done: set[str] = set(params)
    values = policy.values

    def line(keypath: Any) -> str:
        return cfg.source.where(keypath)

    def reads(name: str) -> frozenset[str]:
        if name in values:
            v = values[name]
            if isinstance(v, ExprValue):
                return v.expr.names
            # A pick computes what its condition reads itself (per candidate where needed).
            return frozenset()
        if name in cfg.derived:
            return cfg.derived[name].names
        return frozenset()

    def needs(names: frozenset[str] | set[str], stack: tuple[str, ...] = ()) -> list[str]:
        """Names to compute, dependencies first."""
        order: list[str] = []
        for n in sorted(names):
            if n in done or n in order or n in stack or n not in values and n not in cfg.derived:
                continue
            for m in needs(reads(n), stack + (n,)):
                if m not in order:
                    order.append(m)
            order.append(n)
        return order

    def compute(name: str, indent: int) -> None:
        if name in values:
            v = values[name]
            if isinstance(v, LiteralValue):
                out.append(_stmt(indent, f"{name} = {v.value!r}", line(v.keypath)))
            elif isinstance(v, ExprValue):
                out.append(_stmt(indent, f"{name} = {python(v.expr)}", line(v.keypath)))
            else:
                _pick(name, v, indent)
        else:
            expr = cfg.derived[name]
            out.append(_stmt(indent, f"{name} = {python(expr)}", line((cfg.name, "derived", name))))
        done.add(name)

    def _pick(name: str, v: PickValue, indent: int) -> None:
        # The candidate is bound by the loop; names the condition reads that do not depend on it
        # come first, those that do are computed per candidate.
        done.add(name)
        wanted = needs(v.where.names - {name})
        inner = [n for n in wanted if name in _closure(n)]
        for n in wanted:
            if n not in inner:
                compute(n, indent)
        where = line(v.keypath)
        out.append(_stmt(indent, f"for {name} in {tuple(v.candidates)!r}:", where))
        for n in inner:
            compute(n, indent + 1)
        out.append(_stmt(indent + 1, f"if {python(v.where)}:", ""))
        out.append(_stmt(indent + 2, "break", ""))
        out.append(_stmt(indent, "else:", ""))
        message = f"no candidate for '{name}' in {list(v.candidates)} satisfies '{v.where.source}'"
        shown = [(name, name)] + [(k, c) for k, c in _shown_expr(v.where) if k != name]
        numbers = ", ".join(f"{label!r}: {code}" for label, code in shown)
        out.append(_stmt(indent + 1, f"_rules.no_candidate({_text(message)}, {{{numbers}}})", ""))

    def _closure(n: str, seen: tuple[str, ...] = ()) -> set[str]:
        out_: set[str] = set()
        for m in reads(n):
            if m not in seen:
                out_ |= {m} | _closure(m, seen + (m,))
        return out_

    for name in cfg.fields:
        for n in needs({name}):
            compute(n, 0)
    for check in cfg.checks:
        names = set(check.rule.names) | (set(check.when.names) if check.when else set())
        for n in needs(names):
            compute(n, 0)
        cond = f"not ({python(check.rule)})"
        if check.when is not None:
            cond = f"({python(check.when)}) and {cond}"
        out.append(_stmt(0, f"if {cond}:", f"check {check.spec.name!r}, {line(check.keypath)}"))
        shown = _shown(check)
        numbers = ", ".join(f"{label!r}: {code}" for label, code in shown)
        message = check.spec.message or ""
        out.append(
            _stmt(
                1,
                f"_rules.check_failed({check.spec.name!r}, {_text(check.rule.source)}, {_text(message)}, "
                f"{{{numbers}}}, hw)",
                "",
            )
        )
    fields = ", ".join(f"{f}={f}" for f in cfg.fields)
    out.append(_stmt(0, f"return {cfg.record}({fields})", ""))
    return Function(function_name(cfg, policy), params, model_dims, tuple(out))


def _shown_expr(expr: rules.Expr) -> list[tuple[str, str]]:
    shown = [(n, n) for n in sorted(expr.names)]
    shown += [(f"{ns}.{a}", f"hw.{a}" if ns == "hw" else f"model_{a}") for ns, a in sorted(expr.attrs)]
    return shown


def _shown(check: Any) -> list[tuple[str, str]]:
    """(label, Python expression) of every value a failed check's message shows: the names and
    attributes its rule and message read."""
    shown: dict[str, str] = {}
    for expr in (check.rule,) + ((check.when,) if check.when else ()):
        for n in sorted(expr.names):
            shown[n] = n
        for ns, attr in sorted(expr.attrs):
            shown[f"{ns}.{attr}"] = f"hw.{attr}" if ns == "hw" else f"model_{attr}"
    for _, field, _, _ in string.Formatter().parse(check.spec.message or ""):
        if field:
            root = field.split("[")[0]
            if root.startswith("hw.") or root.startswith("model."):
                ns, attr = root.split(".", 1)
                shown[root] = f"hw.{attr}" if ns == "hw" else f"model_{attr}"
            elif root.isidentifier():
                shown[root] = root
    return list(shown.items())


def _stmt(indent: int, code: str, comment: str) -> dict[str, Any]:
    return {"indent": indent, "code": code, "comment": comment}


def _text(value: str, width: int = 60) -> str:
    """A string literal; a long one as adjacent literals of at most ``width`` characters split at
    spaces, in parentheses, so black can lay it out within generated code's line length."""
    if len(value) <= width:
        return repr(value)
    pieces, piece = [], ""
    for word in value.split(" "):
        if piece and len(piece) + 1 + len(word) > width:
            pieces.append(piece + " ")
            piece = word
        else:
            piece = f"{piece} {word}" if piece else word
    pieces.append(piece)
    return "(" + " ".join(repr(p) for p in pieces) + ")"
