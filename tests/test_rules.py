"""The rule language: what it accepts, what it rejects, how it explains a false check."""

import re

import pytest

from codegen import rules

ENV = rules.Env(
    {"block": 64, "stages": 2, "dtype_bytes": 2}.__getitem__,
    {"hw": {"smem": 49152, "async_copy": True, "sm_count": 16}, "model": {"head_dim": 256}},
)


@pytest.mark.parametrize(
    "source, value",
    [
        ("block * model.head_dim * dtype_bytes * 2", 65536),
        ("2 if hw.async_copy else 1", 2),
        ("ceil_div(1000, hw.sm_count)", 63),
        ("clamp(block * 8, 16, 256)", 256),
        ("pow2_ceil(100) + pow2_floor(100)", 192),
        ("min(block, 32) <= 32 < 33", True),
        ("not hw.async_copy or stages == 2", True),
        ("hw.smem // 1024 % 7", 6),
        ("'triton' if block >= 64 else 'library'", "triton"),
    ],
)
def test_evaluate(source, value):
    assert rules.evaluate(rules.parse(source), ENV) == value


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("__import__('os')", "only calls of"),
        ("block.__class__", "attribute access is only allowed on hw, model"),
        ("[block]", "List is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("block if", "not a valid expression"),
        ("block << 2", "operator LShift is not allowed"),
        ("block in (1, 2)", "only < <= > >= == != comparisons"),
        ("max(block, key=1)", "positional arguments"),
        ("", "non-empty"),
    ],
)
def test_rejected_at_parse(source, fragment):
    with pytest.raises(rules.RuleError, match=None) as exc:
        rules.parse(source)
    assert fragment in str(exc.value)


def test_names_and_attrs_are_collected():
    expr = rules.parse("block * model.head_dim <= hw.smem and ceil_div(stages, 2) > 0")
    assert expr.names == {"block", "stages"}
    assert expr.attrs == {("model", "head_dim"), ("hw", "smem")}


def test_unknown_namespace_attribute_at_evaluation():
    with pytest.raises(rules.RuleError, match="'hw.nope' is not defined"):
        rules.evaluate(rules.parse("hw.nope"), ENV)


def test_explain_failure_shows_both_sides():
    expr = rules.parse("stages >= 1 and block * model.head_dim * dtype_bytes * 2 <= hw.smem")
    assert rules.explain_failure(expr, ENV) == ("block * model.head_dim * dtype_bytes * 2 = 65,536 > hw.smem = 49,152")
    assert rules.explain_failure(rules.parse("not hw.async_copy"), ENV) == "'not hw.async_copy' is false"


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("2 ** 10 ** 10", "2 ** 10,000,000,000 is too large (more than 256 bits)"),
        ("9 ** 9 ** 9", "is too large"),
        ("'x' * 10 ** 9", "strings cannot be multiplied"),
    ],
)
def test_rules_that_would_hang_the_build_are_rule_errors(source, fragment):
    """Evaluated, these would take minutes and gigabytes; a rule stops them at once."""
    with pytest.raises(rules.RuleError, match=re.escape(fragment)):
        rules.evaluate(rules.parse(source), ENV)
    assert rules.evaluate(rules.parse("2 ** 256 + (-2) ** 3 + 2 ** -1 + 1 ** 10 ** 10"), ENV) == 2**256 - 8 + 0.5 + 1


def test_division_by_zero_is_a_rule_error():
    with pytest.raises(rules.RuleError, match="failed"):
        rules.evaluate(rules.parse("block // (stages - 2)"), ENV)


@pytest.mark.parametrize(
    "source",
    ["-" * 5000 + "1", "+".join(["1"] * 1000), "-" * rules.MAX_DEPTH + "1"],
    ids=["5000 unary minus", "1000-term sum", "just past the limit"],
)
def test_deeply_nested_expression_is_a_rule_error(source):
    """Python's parser (or, past it, evaluation) would exceed the recursion limit."""
    with pytest.raises(rules.RuleError, match="expression too deeply nested"):
        rules.parse(source)


def test_nesting_within_the_limit_parses_evaluates_and_explains():
    assert rules.evaluate(rules.parse("-" * 90 + "1"), ENV) == 1
    expr = rules.parse("+".join(["block"] * 40) + " >= hw.smem")
    assert rules.evaluate(expr, ENV) is False
    assert rules.explain_failure(expr, ENV).endswith(" = 2,560 < hw.smem = 49,152")


EVAL_CASES = [
    "block * model.head_dim * dtype_bytes * 2",
    "2 if hw.async_copy else 1",
    "ceil_div(1000, hw.sm_count) - -block + +stages",
    "min(block, 32) <= 32 < 33 and block > 1000",
    "not hw.async_copy or stages == 2 or 0",
    "0 or '' or block",
    "hw.smem // 1024 % 7 / 2",
    "'x' if block >= 64 else 'y'",
    "2 ** 300",  # too large a power
    "2 ** 200 * 2 ** 200 * 2 ** 200",  # an intermediate past MAX_INT_BITS
    "block / 0",
    "hw.nope",
    "model.nope",
    "min",
    "pow2_floor(0)",
    "'ab' + 'c' * 2",
]


@pytest.mark.parametrize("source", EVAL_CASES)
def test_evaluate_gives_what_walking_the_tree_gives(source):
    """evaluate() runs closures made once per rule: the same value, or the same error, as the
    tree walker (_eval) that explanations use, on the first and a later evaluation."""
    expr = rules.parse(source)

    def outcome(fn):
        try:
            return ("value", fn())
        except Exception as exc:  # noqa: BLE001 - the exception is the outcome compared
            return (type(exc).__name__, str(exc))

    def walked():
        try:
            return rules._eval(expr.tree.body, ENV)
        except rules.RuleError:
            raise
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise rules.RuleError(f"evaluating '{expr.source}' failed: {exc}") from None

    expected = outcome(walked)
    assert outcome(lambda: rules.evaluate(expr, ENV)) == expected
    assert outcome(lambda: rules.evaluate(expr, ENV)) == expected
