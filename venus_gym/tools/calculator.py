"""An example plug-in tool: `calculator(expression)`, safe arithmetic without eval.

The expression is parsed with `ast` and only numbers, + - * / // % **, unary signs,
parentheses and a few functions (abs, round, min, max, sqrt) are evaluated; anything else
(names, attributes, calls to other functions, strings) is refused with a reason. Sizes are
bounded so that a model cannot stall a rollout: at most 500 characters, integers below
10**1000 and exponents that keep the result so.

Offer it with `gym.make("DeepResearch-v0", extra_tools=["calculator"])`.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from .plugin import register_tool

MAX_CHARS = 500
MAX_DIGITS = 1000
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt}


class CalculatorError(ValueError):
    """The expression is not arithmetic this calculator evaluates; the text says why."""


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
        raise CalculatorError(f"result has more than {MAX_DIGITS} digits")
    if isinstance(value, complex):  # (-8) ** 0.5
        raise CalculatorError("result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    return value


def _power(base: Any, exponent: Any) -> Any:
    # Decide before computing: 9**9**9 would take minutes and gigabytes.
    if abs(base) > 1 and abs(exponent) * math.log10(abs(base)) > MAX_DIGITS:
        raise CalculatorError(f"result has more than {MAX_DIGITS} digits")
    return base**exponent


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS and not node.keywords):
        arguments = [_evaluate(a) for a in node.args]
        try:
            return _check_size(_FUNCTIONS[node.func.id](*arguments))
        except (TypeError, ValueError) as e:
            raise CalculatorError(f"{node.func.id}: {e}") from None
    what = type(node).__name__
    if isinstance(node, ast.Name | ast.Call):
        what = f"'{ast.unparse(node)[:40]}'"
    raise CalculatorError(f"{what} is not allowed; use numbers, + - * / // % **, parentheses "
                          f"and {', '.join(_FUNCTIONS)}")


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression; CalculatorError says what is wrong."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression is {len(expression)} characters, over {MAX_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:
        raise CalculatorError(f"not an arithmetic expression ({getattr(e, 'msg', e)})") from None
    try:
        return _evaluate(tree)
    except RecursionError:
        raise CalculatorError("expression is nested too deeply") from None
    except OverflowError:
        raise CalculatorError("result is too large") from None


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g") if isinstance(value, float) else str(value)


class CalculatorTool:
    """`calculator({"expression": "..."})` -> "2*(3+4) = 14"."""

    name = "calculator"
    schema = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": ("Evaluate an arithmetic expression exactly: numbers, + - * / // % "
                            "**, parentheses, abs, round, min, max, sqrt."),
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "minLength": 1,
                                   "description": "The expression, e.g. \"(1871 - 1850) * 12\"."},
                },
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    }

    def call(self, arguments: dict) -> str:
        """Raises CalculatorError, which the environment shows as a failed call."""
        expression = arguments["expression"]
        return f"{expression.strip()} = {format_number(calculate(expression))}"


register_tool("calculator", CalculatorTool)
