"""SQL92 subscription expressions over a message's properties, with the grammar and the
evaluation of Apache RocketMQ's filter module (SelectorParser.jj, ComparisonExpression,
LogicExpression, UnaryExpression): comparisons (``=``, ``<>``, ``>``, ``>=``, ``<``,
``<=``), ``[NOT] BETWEEN … AND …``, ``[NOT] IN ('…', …)``, ``IS [NOT] NULL``, ``AND``,
``OR``, ``NOT``, parentheses, unary ``+``/``-``, string ('…', '' for a quote), integer,
decimal and boolean literals, ``NULL``, ``--`` and ``/* */`` comments; keywords in any case.

Values are three-valued as in Apache's evaluation: a property the message lacks is NULL,
and a comparison with NULL is unknown (None), which AND, OR and NOT carry as SQL does; a
message matches only when the whole expression is TRUE. A property's value is its string,
converted for a comparison with a number as Apache converts it (``Long.valueOf`` against
an integer, ``Double.valueOf`` against a decimal, both sides as decimals for ``>``, ``<``
of two strings); a value that does not convert makes the evaluation fail, and the message
is not matched (Apache's broker logs and skips it).

The grammar is small and Apache's is its own (JavaCC): a recursive-descent parser of the
same productions, with Apache's parse-time checks and their words, is shorter here than a
parser library's grammar plus the checks. Unlike Apache's parser (which stops after the
expression), input left over after it is refused."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

EXPRESSION_LENGTH_MAX = 4096
DEPTH_MAX = 64  # nesting of parentheses and NOT: a bound on the parser's recursion
Value = None | bool | int | float | str
Evaluate = Callable[[Mapping[str, str]], Value]

_TOKEN = re.compile(
    r"""(?P<skip>\s+|--[^\n\r]*|/\*.*?\*/)
    |(?P<float>(?:\d+\.\d*|\.\d+)(?:e[+-]?\d+)?|\d+e[+-]?\d+)
    |(?P<int>(?:0|[1-9]\d*)l?)
    |(?P<string>'(?:''|[^'])*')
    |(?P<id>[a-z_$][a-z0-9_$]*)
    |(?P<op><>|>=|<=|=|>|<|\(|\)|,|\+|-)""",
    re.IGNORECASE | re.DOTALL | re.VERBOSE,
)
_KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_JAVA_LONG = re.compile(r"[+-]?\d+")
_JAVA_DOUBLE = re.compile(r"\s*[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|NaN|Infinity)[fFdD]?\s*")


class SelectorError(ValueError):
    """The expression does not parse, or fails one of Apache's parse-time checks."""


class _EvaluationFailed(Exception):
    """A value that does not convert (Apache's NumberFormatException): not matched."""


@dataclass(frozen=True)
class _Node:
    """A parsed expression: how it evaluates, what it is for Apache's checks, and its text."""

    evaluate: Evaluate
    text: str
    boolean: bool = False  # Apache's BooleanExpression (comparisons, logic, TRUE/FALSE/NULL)
    constant: bool = False
    value: Value = None  # the constant's value
    prop: str | None = None  # a property reference's name


@dataclass(frozen=True)
class Selector:
    """A parsed SQL92 expression."""

    expression: str
    _root: _Node

    def matches(self, properties: Mapping[str, str]) -> bool:
        try:
            return self._root.evaluate(properties) is True
        except _EvaluationFailed:
            return False


def parse(expression: str) -> Selector:
    """The expression parsed; SelectorError (with what is wrong) when it is not one."""
    if len(expression) > EXPRESSION_LENGTH_MAX:
        raise SelectorError(f"the expression is {len(expression)} characters, more than {EXPRESSION_LENGTH_MAX}")
    parser = _Parser(_tokens(expression))
    root = parser.boolean(parser.or_expression())
    if parser.peek() is not None:
        raise SelectorError(f"unexpected {parser.peek()[1]!r} after the expression")  # type: ignore[index]
    return Selector(expression, root)


def _tokens(expression: str) -> list[tuple[str, str]]:
    tokens = []
    position = 0
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            raise SelectorError(f"unexpected character {expression[position]!r} at {position}")
        kind, text = match.lastgroup or "", match.group()
        position = match.end()
        if kind == "skip":
            continue
        if kind == "id" and text.upper() in _KEYWORDS:
            kind, text = "keyword", text.upper()
        tokens.append((kind, text))
    return tokens


def _constant(value: Value, text: str) -> _Node:
    return _Node(lambda _: value, text, boolean=value is None or isinstance(value, bool), constant=True, value=value)


def _property(name: str) -> _Node:
    return _Node(lambda properties: properties.get(name), name, prop=name)


class _Parser:
    """SelectorParser.jj's productions, one method each."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens = tokens
        self.position = 0
        self.depth = 0

    def peek(self, ahead: int = 0) -> tuple[str, str] | None:
        index = self.position + ahead
        return self.tokens[index] if index < len(self.tokens) else None

    def accept(self, kind: str, text: str | None = None) -> bool:
        token = self.peek()
        if token is not None and token[0] == kind and (text is None or token[1] == text):
            self.position += 1
            return True
        return False

    def expect(self, kind: str, text: str | None = None) -> str:
        token = self.peek()
        if token is None or token[0] != kind or (text is not None and token[1] != text):
            wanted = text or kind
            raise SelectorError(f"expected {wanted} but found {token[1]!r}" if token else f"expected {wanted} at the end")
        self.position += 1
        return token[1]

    def keyword_pair(self, first: str, second: str) -> bool:
        if self.peek() == ("keyword", first) and self.peek(1) == ("keyword", second):
            self.position += 2
            return True
        return False

    @staticmethod
    def boolean(node: _Node) -> _Node:
        """SelectorParser.asBooleanExpression: a property read as a boolean, or refused."""
        if node.boolean:
            return node
        if node.prop is not None:
            return _Node(_boolean_cast(node.evaluate), node.text, boolean=True)
        raise SelectorError(f"Expression will not result in a boolean value: {node.text}")

    def or_expression(self) -> _Node:
        left = self.and_expression()
        while self.accept("keyword", "OR"):
            left = _or(self.boolean(left), self.boolean(self.and_expression()))
        return left

    def and_expression(self) -> _Node:
        left = self.equality_expression()
        while self.accept("keyword", "AND"):
            left = _and(self.boolean(left), self.boolean(self.equality_expression()))
        return left

    def equality_expression(self) -> _Node:
        left = self.comparison_expression()
        while True:
            if self.accept("op", "="):
                left = _equal(left, self.comparison_expression())
            elif self.accept("op", "<>"):
                left = _not(_equal(left, self.comparison_expression()))
            elif self.keyword_pair("IS", "NULL"):
                left = _is_null(left)
            elif self.peek() == ("keyword", "IS"):
                self.position += 1
                self.expect("keyword", "NOT")
                self.expect("keyword", "NULL")
                left = _not(_is_null(left))
            else:
                return left

    def comparison_expression(self) -> _Node:
        left = self.unary()
        while True:
            token = self.peek()
            if token is not None and token[0] == "op" and token[1] in _ORDER:
                self.position += 1
                left = _ordered(token[1], left, self.unary())
            elif self.accept("keyword", "BETWEEN"):
                left = self.between(left, negated=False)
            elif self.keyword_pair("NOT", "BETWEEN"):
                left = self.between(left, negated=True)
            elif self.accept("keyword", "IN"):
                left = _in(left, self.string_list(), negated=False)
            elif self.keyword_pair("NOT", "IN"):
                left = _in(left, self.string_list(), negated=True)
            else:
                return left

    def between(self, value: _Node, negated: bool) -> _Node:
        low = self.unary()
        self.expect("keyword", "AND")
        high = self.unary()
        if low.constant and high.constant:
            if low.value is None or high.value is None:
                raise SelectorError("Illegal values of between, values can not be null!")
            if _compare(high.value, low.value) < 0:
                raise SelectorError(
                    f"Illegal values of between, left value({_java_text(low.value)}) must less than or equal to "
                    f"right value({_java_text(high.value)})"
                )
        if negated:
            return _or(_ordered("<", value, low), _ordered(">", value, high))
        return _and(_ordered(">=", value, low), _ordered("<=", value, high))

    def string_list(self) -> list[str]:
        self.expect("op", "(")
        items = [_string_value(self.expect("string"))]
        while self.accept("op", ","):
            items.append(_string_value(self.expect("string")))
        self.expect("op", ")")
        return items

    def unary(self) -> _Node:
        self.depth += 1
        if self.depth > DEPTH_MAX:
            raise SelectorError(f"the expression nests deeper than {DEPTH_MAX}")
        try:
            if self.accept("op", "+"):
                return self.unary()
            if self.accept("op", "-"):
                return _negate(self.unary())
            if self.accept("keyword", "NOT"):
                return _not(self.boolean(self.unary()))
            return self.primary()
        finally:
            self.depth -= 1

    def primary(self) -> _Node:
        token = self.peek()
        if token is None:
            raise SelectorError("the expression ends too soon")
        kind, text = token
        self.position += 1
        if kind == "string":
            return _constant(_string_value(text), text)
        if kind == "int":
            number = int(text.rstrip("lL"))
            if number > _LONG_MAX:
                raise SelectorError(f"the number {text} is out of range")
            return _constant(number, text)
        if kind == "float":
            return _constant(float(text), text)
        if kind == "keyword" and text in ("TRUE", "FALSE", "NULL"):
            return _constant({"TRUE": True, "FALSE": False, "NULL": None}[text], text)
        if kind == "id":
            return _property(text)
        if (kind, text) == ("op", "("):
            inner = self.or_expression()
            self.expect("op", ")")
            return inner
        raise SelectorError(f"unexpected {text!r}")


def _string_value(text: str) -> str:
    return text[1:-1].replace("''", "'")


def _java_text(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Evaluation, as Apache's expression classes evaluate.


def _boolean_cast(inner: Evaluate) -> Evaluate:
    def evaluate(properties: Mapping[str, str]) -> Value:
        value = inner(properties)
        if value is None:
            return None
        return value if isinstance(value, bool) else False

    return evaluate


def _not(node: _Node) -> _Node:
    inner = node.evaluate

    def evaluate(properties: Mapping[str, str]) -> Value:
        value = inner(properties)
        return None if value is None else not value

    return _Node(evaluate, f"NOT {node.text}", boolean=True)


def _and(left: _Node, right: _Node) -> _Node:
    def evaluate(properties: Mapping[str, str]) -> Value:
        lv = left.evaluate(properties)
        if lv is False:
            return False
        rv = right.evaluate(properties)
        if rv is False:
            return False
        return None if lv is None or rv is None else True

    return _Node(evaluate, f"({left.text} AND {right.text})", boolean=True)


def _or(left: _Node, right: _Node) -> _Node:
    def evaluate(properties: Mapping[str, str]) -> Value:
        lv = left.evaluate(properties)
        if lv is True:
            return True
        rv = right.evaluate(properties)
        if rv is True:
            return True
        return None if lv is None or rv is None else False

    return _Node(evaluate, f"({left.text} OR {right.text})", boolean=True)


def _negate(node: _Node) -> _Node:
    if node.constant and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _constant(-node.value, f"-{node.text}")
    inner = node.evaluate

    def evaluate(properties: Mapping[str, str]) -> Value:
        value = inner(properties)
        return -value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return _Node(evaluate, f"-{node.text}")


def _is_null(node: _Node) -> _Node:
    inner = node.evaluate
    return _Node(lambda properties: inner(properties) is None, f"{node.text} IS NULL", boolean=True)


def _equal(left: _Node, right: _Node) -> _Node:
    """ComparisonExpression.createEqual, with its checks."""
    for side in (left, right):
        if side.constant and side.value is None:
            raise SelectorError(f"'{side.text}' cannot be compared.")
    if left.constant and right.constant and left.boolean and not right.boolean:
        raise SelectorError(f"'{left.text}' cannot be compared with '{right.text}'")

    def evaluate(properties: Mapping[str, str]) -> Value:
        lv, rv = left.evaluate(properties), right.evaluate(properties)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        if lv is None or (type(lv) is type(rv) and lv == rv):
            return True
        return _compare(lv, rv) == 0

    return _Node(evaluate, f"{left.text} = {right.text}", boolean=True)


_ORDER: dict[str, Callable[[int], bool]] = {
    ">": lambda answer: answer > 0,
    ">=": lambda answer: answer >= 0,
    "<": lambda answer: answer < 0,
    "<=": lambda answer: answer <= 0,
}


def _ordered(symbol: str, left: _Node, right: _Node) -> _Node:
    """ComparisonExpression's >, >=, <, <=: numbers only (checkLessThanOperand)."""
    for side in (left, right):
        numeric = isinstance(side.value, (int, float)) and not isinstance(side.value, bool)
        if (side.constant and not numeric) or (side.boolean and not side.constant):
            raise SelectorError(f"Value '{side.text}' cannot be compared.")
    holds = _ORDER[symbol]

    def evaluate(properties: Mapping[str, str]) -> Value:
        lv = left.evaluate(properties)
        if lv is None:
            return None
        rv = right.evaluate(properties)
        if rv is None:
            return None
        if isinstance(lv, str) and isinstance(rv, str):
            lv, rv = _java_double(lv), _java_double(rv)
        return holds(_compare(lv, rv))

    return _Node(evaluate, f"{left.text} {symbol} {right.text}", boolean=True)


def _in(left: _Node, items: list[str], negated: bool) -> _Node:
    if left.prop is None:
        raise SelectorError(f"Expected a property for In expression, got: {left.text}")
    members = frozenset(items)
    inner = left.evaluate

    def evaluate(properties: Mapping[str, str]) -> Value:
        value = inner(properties)
        if not isinstance(value, str):
            return None
        return (value in members) != negated

    return _Node(evaluate, f"{left.text} {'NOT IN' if negated else 'IN'} {items}", boolean=True)


def _java_long(text: str) -> int:
    if not _JAVA_LONG.fullmatch(text) or not _LONG_MIN <= int(text) <= _LONG_MAX:
        raise _EvaluationFailed(text)
    return int(text)


def _java_double(text: str) -> float:
    if not _JAVA_DOUBLE.fullmatch(text):
        raise _EvaluationFailed(text)
    return float(text.strip().rstrip("fFdD"))


def _compare(lv: Value, rv: Value) -> int:
    """ComparisonExpression.__compare with string conversion on (RocketMQ's default):
    the sign of lv - rv, after converting one side to the other's type; -1 where Apache
    finds no conversion."""
    if isinstance(lv, bool) or isinstance(rv, bool):
        if isinstance(lv, bool) and isinstance(rv, bool):
            return (lv > rv) - (lv < rv)
        if isinstance(lv, str):
            converted = lv.lower() == "true"
            return (converted > rv) - (converted < rv)  # type: ignore[operator]
        if isinstance(lv, bool) and isinstance(rv, str):
            raise _EvaluationFailed(rv)  # Apache casts the Boolean to a String: a ClassCastException
        return -1
    if isinstance(lv, str) and isinstance(rv, (int, float)):
        lv = _java_long(lv) if isinstance(rv, int) else _java_double(lv)
    elif isinstance(rv, str) and isinstance(lv, (int, float)):
        rv = _java_long(rv) if isinstance(lv, int) else _java_double(rv)
    elif type(lv) is not type(rv) and not (isinstance(lv, (int, float)) and isinstance(rv, (int, float))):
        return -1
    return (lv > rv) - (lv < rv)  # type: ignore[operator]
