"""Each zoo task's "right attention" as numbers: which keys each query should read.

The model cards describe the attention a task calls for (models/tasks.py, ``Task.attention``).
``right_keys(task, src)`` turns that description into, per query row, the key positions the rule
names (or None where it says nothing), and ``head_scores`` measures how much of each head's weight
lands there. The Training page draws that score over the snapshots, so the step where a head learns
the rule is visible; a uniform head scores about 1 / (number of keys).

Positions: the source is its characters then EOS (index ``len(src)``). For the four seq2seq tasks
the rule is about cross-attention, with one query row per target token plus the EOS row (decoder
input = BOS + target: row t writes target token t); for brackets it is about encoder
self-attention, one row per character plus the EOS row.
"""

from __future__ import annotations

import numpy as np

from attnscope.models import tasks as T

Rows = list[list[int] | None]


def right_keys(task: str, src: str) -> tuple[str, Rows]:
    """(the attention kind the rule is about, per query row the keys it should read or None).

    ValueError when ``src`` is not an input of the task."""
    answer = T.get(task).answer(src)  # raises ValueError for a source the task cannot read
    n = len(src)
    if task == "reverse":
        return "cross", [[n - 1 - t] for t in range(n)] + [[n]]
    if task == "sort":
        return "cross", [[i for i, c in enumerate(src) if c == d] for d in answer] + [None]
    if task == "dates":
        return "cross", _date_rows(src)
    if task == "numbers":
        return "cross", _number_rows(src) + [None]
    if task == "brackets":
        return "enc_self", [None if p is None else [p] for p in T.bracket_partners(src)] + [None]
    raise ValueError(f"no attention rule for task {task!r}")


def _date_rows(src: str) -> Rows:
    """Output YYYY-MM-DD: the year digits read the year, the month digits the month (number or
    name), the day digits the day; the dashes and EOS are not covered."""
    offset = len(src) - len(src.lstrip())
    text = src.strip().lower()  # lower() keeps the length of every character these formats use
    for pattern in T._DATE_PATTERNS:
        m = pattern.match(text)
        if m:
            month = "m" if m.groupdict().get("m") else "mon"

            def span(group: str, m=m) -> list[int]:
                a, b = m.span(group)
                return list(range(a + offset, b + offset))

            year, mon, day = span("y"), span(month), span("d")
            return [year] * 4 + [None] + [mon] * 2 + [None] + [day] * 2 + [None]
    raise ValueError(f"not a date this task writes: {src!r}")


def _number_rows(src: str) -> Rows:
    """Per English word of attnscope.models.tasks.number_words: the digits it spells ("X hundred": the
    hundreds digit; a word below 100: its tens and/or units digit; "thousand": the last digit of
    the thousands group; "zero": the digit 0)."""
    n = int(src)
    pos = lambda place: len(src) - 1 - place  # noqa: E731  (the digit of 10**place)
    if n == 0:
        return [[0]]
    rows: Rows = []

    def group(g: int, base: int) -> None:
        hundreds, rest = divmod(g, 100)
        if hundreds:
            rows.extend([[pos(base + 2)]] * 2)  # "X hundred"
        if rest:
            tens, unit = divmod(rest, 10)
            if rest < 10:
                rows.append([pos(base)])
            elif rest < 20 or unit:
                rows.append([pos(base + 1), pos(base)])
            else:
                rows.append([pos(base + 1)])

    thousands, rest = divmod(n, 1000)
    if thousands:
        group(thousands, 3)
        rows.append([pos(3)])  # "thousand"
    group(rest, 0)
    words = T.number_words(n).split()
    if len(rows) != len(words):  # the rule must follow number_words word for word
        raise AssertionError(f"{src}: {len(rows)} rows for {len(words)} words")
    return rows


def rule_matrix(rows: Rows, n_queries: int, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """(bool [query, key]: the right keys, bool [query]: rows the rule covers), cut to the map's size."""
    right = np.zeros((n_queries, n_keys), dtype=bool)
    covered = np.zeros(n_queries, dtype=bool)
    for i, keys in enumerate(rows[:n_queries]):
        if keys and all(0 <= k < n_keys for k in keys):
            right[i, keys] = True
            covered[i] = True
    return right, covered


def head_scores(stack: np.ndarray, rows: Rows) -> np.ndarray:
    """[layer, head, query, key] weights -> [layer, head]: the mean over covered rows of the weight on
    the right keys (1 = every covered row reads exactly the rule's keys); NaN when no row is covered."""
    stack = np.asarray(stack, dtype=np.float64)
    right, covered = rule_matrix(rows, stack.shape[-2], stack.shape[-1])
    if not covered.any():
        return np.full(stack.shape[:-2], np.nan)
    mass = (stack * right).sum(-1)  # [..., query]
    return mass[..., covered].mean(-1)


def right_score(probs: np.ndarray, rows: Rows) -> float:
    """One head's [query, key] weights -> its score (see head_scores)."""
    return float(head_scores(np.asarray(probs)[None, None], rows)[0, 0])


def entropy(stack: np.ndarray) -> np.ndarray:
    """[layer, head, query, key] -> [layer, head]: the mean over query rows of each row's entropy
    in nats (0 = one key takes everything; log(k) = uniform over k keys)."""
    p = np.asarray(stack, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(-1).mean(-1)
