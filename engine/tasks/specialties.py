"""The nine paper specialties: their compact (seed-model) rendering and safe scorers.

The compact style is the seed model's own language: a short prompt built from the RG item's
metadata and a short target completion (a tiny scratchpad where one helps, then `<answer>…</answer>`).
It exists because ReasoningGym's question texts are 46–308 tokens, too long for a model trained
from scratch on two CPU cores. The question *hash* always covers RG's own text, never this rendering.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

SPECIALTIES: tuple[str, ...] = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def wrap_answer(answer: str) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def _grid(row: list[int]) -> str:
    return "".join(str(v) for v in row)


def _round_decimal(answer: str, places: int) -> str:
    """RG gives up to 12 significant digits for divisions; its scorer tolerates 10^-places, so a
    demonstration rounded to places+1 digits is still exactly right and far shorter."""
    try:
        value = Decimal(answer)
    except InvalidOperation:
        return answer
    if -value.as_tuple().exponent <= places + 1:  # type: ignore[operator]
        return answer
    return str(value.quantize(Decimal(10) ** -(places + 1)))


# Each compact renderer returns (prompt, target completion) or None when the item's shape is not
# one the compact style covers (then the generic fallback is used: the RG text itself).
CompactFn = Callable[[dict[str, Any]], "tuple[str, str] | None"]


def _base_conversion(e: dict[str, Any]) -> tuple[str, str]:
    m = e["metadata"]
    # The decimal value is a one-step scratchpad: source -> decimal -> target.
    return (f"base {m['source_base']}>{m['target_base']} {m['source_repr']}",
            f"{m['decimal_value']} {wrap_answer(e['answer'])}")


def _basic_arithmetic(e: dict[str, Any]) -> tuple[str, str]:
    return f"calc {e['metadata']['expression']}", wrap_answer(e["answer"])


def _arc_1d(e: dict[str, Any]) -> tuple[str, str] | None:
    m = e["metadata"]
    if not all(0 <= v <= 9 for ex in m["train_examples"] for v in ex["input"] + ex["output"]):
        return None
    pairs = " ".join(f"{_grid(ex['input'])}>{_grid(ex['output'])}" for ex in m["train_examples"])
    return f"arc {pairs} {_grid(m['test_example']['input'])}>", wrap_answer(e["answer"])


def _bf(e: dict[str, Any]) -> tuple[str, str]:
    return f"bf {e['metadata']['bf_program']}", wrap_answer(e["answer"])


def _propositional_logic(e: dict[str, Any]) -> tuple[str, str]:
    m = e["metadata"]
    return f"logic {'; '.join(m['premises'])}", wrap_answer(m["example_answer"])


def _fraction(e: dict[str, Any]) -> tuple[str, str]:
    m = e["metadata"]
    return (f"frac {m['numerator']}/{m['denominator']}",
            wrap_answer(f"{m['simplified_numerator']}/{m['simplified_denominator']}"))


def _decimal(e: dict[str, Any]) -> tuple[str, str] | None:
    expr = e["question"].strip().split("\n")[-1].removesuffix(" = ?").strip()
    if not expr:
        return None
    places = int(e["metadata"]["decimal_places"])
    return f"dec {expr}", wrap_answer(_round_decimal(e["answer"], places))


def _calendar(e: dict[str, Any]) -> tuple[str, str] | None:
    m = e["metadata"]
    if m.get("task") == "weekday_offset":
        start = dt.date.fromisoformat(m["start_date"])
        return f"day {WEEKDAYS[start.weekday()][:3]} {int(m['offset_days']):+d}", wrap_answer(e["answer"])
    if m.get("task") == "is_leap_year":
        return f"leap {m['year']}", wrap_answer(e["answer"])
    return None


def _binary_matrix(e: dict[str, Any]) -> tuple[str, str]:
    rows = "/".join(_grid(row) for row in e["metadata"]["matrix"])
    return f"dist {rows}", wrap_answer(e["answer"])


COMPACT: dict[str, CompactFn] = {
    "base_conversion": _base_conversion,
    "basic_arithmetic": _basic_arithmetic,
    "arc_1d": _arc_1d,
    "bf": _bf,
    "propositional_logic": _propositional_logic,
    "fraction_simplification": _fraction,
    "decimal_arithmetic": _decimal,
    "calendar_arithmetic": _calendar,
    "binary_matrix": _binary_matrix,
}


def compact_pair(specialty: str, entry: dict[str, Any]) -> tuple[str, str]:
    """(compact prompt, demonstration completion) for one RG entry."""
    fn = COMPACT.get(specialty)
    pair = fn(entry) if fn is not None else None
    if pair is not None:
        return pair
    return f"{specialty}: {entry['question'].strip()}", wrap_answer(ground_truth(entry))


def ground_truth(entry: dict[str, Any]) -> str:
    """RG's answer as text; propositional_logic has none and scores against its example answer."""
    truth = entry["answer"] if entry["answer"] is not None else entry["metadata"].get("example_answer", "")
    return str(truth)


def binary_matrix_score(answer: str, entry: dict[str, Any]) -> float:
    """RG's binary_matrix scorer calls `eval()` on the answer (a peer's completion!): never run it.
    Exact match earns 1.0; RG's 0.1 for a Python-list rendering is dropped (it needed eval)."""
    return 1.0 if answer == entry["answer"] else 0.0


# Specialties whose RG scorer is replaced by ours (security), keyed by name.
SAFE_SCORERS: dict[str, Callable[[str, dict[str, Any]], float]] = {
    "binary_matrix": binary_matrix_score,
}
