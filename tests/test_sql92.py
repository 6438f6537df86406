"""SQL92 subscription expressions (writer.sql92) evaluated as Apache RocketMQ's filter
module evaluates them, over a message's string properties, and refused with its words."""

from __future__ import annotations

import pytest

from rmqstore.writer.sql92 import SelectorError, parse

PROPERTIES = {"a": "5", "b": "red", "c": "2.5", "flag": "true", "neg": "-3", "quote": "it's", "big": "x9"}

MATCHES = [
    ("a = 5", True), ("a = '5'", True), ("a <> 5", False), ("a > 4", True), ("a >= 5", True), ("a < 5", False),
    ("a <= 5.0", True), ("c > 2.0", True), ("c < 2.6", True), ("neg < -2", True), ("neg = -3", True),
    ("a BETWEEN 1 AND 5", True), ("a BETWEEN 6 AND 9", False), ("a NOT BETWEEN 6 AND 9", True),
    ("b IN ('red', 'blue')", True), ("b NOT IN ('red')", False), ("b = 'red' AND a = 5", True),
    ("b = 'blue' OR a = 5", True), ("NOT (a = 5)", False), ("missing IS NULL", True), ("a IS NOT NULL", True),
    ("a IS NULL", False), ("quote = 'it''s'", True), ("b = 'RED'", False), ("flag = TRUE", True),
    # NULL is unknown: neither the comparison nor its negation matches, and OR/AND carry it.
    ("missing = 1", False), ("NOT (missing = 1)", False), ("missing > 1 OR a = 5", True), ("missing > 1 AND a = 5", False),
    ("missing IN ('x')", False), ("missing NOT IN ('x')", False),
    # A value that does not convert to a number fails the evaluation: not matched either way.
    # Against an integer the value converts as Long.valueOf does: "2.5" does not.
    ("big > 1", False), ("NOT (big > 1)", False), ("b = 1", False), ("c > 2", False), ("NOT (c > 2)", False),
    ("a > 4 -- a comment\n", True), ("/* c */ a = 5", True), ("a = 5 and B is null", True), ("TRUE", True), ("FALSE", False),
    ("a = 5L", True), ("c = 2.5", True), ("a = 5.0", True), ("a", False),
]  # fmt: skip


@pytest.mark.parametrize(("expression", "matched"), MATCHES)
def test_expressions_match_as_apaches_filter_evaluates_them(expression: str, matched: bool) -> None:
    assert parse(expression).matches(PROPERTIES) is matched


REFUSED = [
    ("", "the expression ends too soon"),
    ("a >", "the expression ends too soon"),
    ("a > 'x'", "Value ''x'' cannot be compared."),
    ("a > TRUE", "Value 'TRUE' cannot be compared."),
    ("a = NULL", "'NULL' cannot be compared."),
    ("TRUE = 1", "'TRUE' cannot be compared with '1'"),
    ("a BETWEEN 5 AND 1", "Illegal values of between, left value(5) must less than or equal to right value(1)"),
    ("'x' IN ('x')", "Expected a property for In expression, got: 'x'"),
    ("a IN (1)", "expected string but found '1'"),
    ("5", "Expression will not result in a boolean value: 5"),
    ("a = 1 b", "unexpected 'b' after the expression"),
    ("a = 1 AND", "the expression ends too soon"),
    ("a # 1", "unexpected character '#' at 2"),
    ("(a = 1", "expected ) at the end"),
    ("a LIKE 'x%'", "unexpected 'LIKE' after the expression"),
    ("a = 99999999999999999999", "the number 99999999999999999999 is out of range"),
    ("NOT " * 70 + "a", "the expression nests deeper than 64"),
    ("a = '" + "x" * 5000 + "'", "the expression is 5006 characters, more than 4096"),
]


@pytest.mark.parametrize(("expression", "problem"), REFUSED)
def test_bad_expressions_are_refused_with_what_is_wrong(expression: str, problem: str) -> None:
    with pytest.raises(SelectorError) as raised:
        parse(expression)
    assert str(raised.value) == problem
