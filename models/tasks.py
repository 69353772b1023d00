"""Seeded data generators and exact checkers for the zoo's tasks.

Every task has one generator function ``NAME(rng) -> (source, target)`` that draws
one example from a ``random.Random``, and one reference ``answer_NAME(source)`` that
computes the right output from the source alone (it is what the checker uses, so
a label the generator gets wrong is caught by the tests). For the classifier the
target is the class label ("balanced" / "unbalanced").

``generate(task, n, seed)`` draws n examples; ``check(task, source, output)`` says
whether an output is exactly right.

Held-out means never seen. Each task's input space is split by construction: a stable hash of an
input's *split key* puts it on the held-out side (HELDOUT_PER_MILLE of all keys) or the training
side. ``training_stream`` only ever yields training-side inputs and ``heldout_set`` only
held-out ones, so no held-out input can be drawn in training, whatever the seed or the number
of steps. The key is the source itself, except for dates, whose key is the day: a held-out day is
never seen in training in any of the ways it can be written.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# Seeds: training streams use --seed (default TRAIN_SEED); VAL_SEED picks the early-stopping
# set; EVAL_SEED the 1,000 held-out examples a model card reports. Never train on these two.
TRAIN_SEED = 1
VAL_SEED = 7_777
EVAL_SEED = 20_261_121
RESERVED_SEEDS = (VAL_SEED, EVAL_SEED)

Example = tuple[str, str]
HELDOUT_PER_MILLE = 100  # 10% of each task's input space is held out (by hash of the split key)

# -- reverse ----------------------------------------------------------------------------


# Share of strings drawn from only 1-3 distinct symbols, so that long runs of one symbol
# ("aaaa", "00009999") are common enough to be learned (uniform draws almost never have them).
P_FEW_SYMBOLS = 0.25


def _symbols(rng: random.Random, alphabet: str, max_chars: int) -> str:
    if rng.random() < P_FEW_SYMBOLS:
        alphabet = "".join(rng.sample(alphabet, rng.randint(1, 3)))
    return "".join(rng.choices(alphabet, k=rng.randint(1, max_chars)))


def reverse(rng: random.Random, max_chars: int = 20) -> Example:
    """A lowercase string of 1..max_chars letters -> the same string reversed."""
    s = _symbols(rng, string.ascii_lowercase, max_chars)
    return s, s[::-1]


def answer_reverse(src: str) -> str:
    return src[::-1]


# -- sort -------------------------------------------------------------------------------


def sort_digits(rng: random.Random, max_chars: int = 20) -> Example:
    """A string of 1..max_chars digits -> its digits in ascending order."""
    s = _symbols(rng, string.digits, max_chars)
    return s, "".join(sorted(s))


def answer_sort(src: str) -> str:
    return "".join(sorted(src))


# -- dates ------------------------------------------------------------------------------

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
FIRST_DAY = dt.date(1900, 1, 1)
LAST_DAY = dt.date(2099, 12, 31)


def ordinal(day: int) -> str:
    """1 -> '1st', 2 -> '2nd', 11 -> '11th', 22 -> '22nd'."""
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


# Every way a date is written, as a function of the date (and the rng for padding).
# The US numeric month/day form is left out on purpose: 03/04/2026 would be ambiguous.
def _day(rng: random.Random, d: dt.date, p_pad: float) -> str:
    return f"{d.day:02d}" if rng.random() < p_pad else str(d.day)


def _numeric(sep: str) -> Callable[[random.Random, dt.date], str]:
    def fmt(rng: random.Random, d: dt.date) -> str:
        month = f"{d.month:02d}" if rng.random() < 0.6 else str(d.month)
        return f"{_day(rng, d, 0.6)}{sep}{month}{sep}{d.year}"

    return fmt


DATE_FORMATS: dict[str, Callable[[random.Random, dt.date], str]] = {
    "dd/mm/yyyy": _numeric("/"),  # 21/11/2026, 1/2/2026
    "dd.mm.yyyy": _numeric("."),  # 21.11.2026
    "dd-mm-yyyy": _numeric("-"),  # 21-11-2026
    "d Mon yyyy": lambda r, d: f"{_day(r, d, 0.15)} {MONTHS[d.month - 1][:3]} {d.year}",
    "d Month yyyy": lambda r, d: f"{_day(r, d, 0.15)} {MONTHS[d.month - 1]} {d.year}",
    "dth Month yyyy": lambda r, d: f"{ordinal(d.day)} {MONTHS[d.month - 1]} {d.year}",
    "dth Mon yyyy": lambda r, d: f"{ordinal(d.day)} {MONTHS[d.month - 1][:3]} {d.year}",
    "Month d, yyyy": lambda r, d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    "Mon d, yyyy": lambda r, d: f"{MONTHS[d.month - 1][:3]} {d.day}, {d.year}",
    "Month dth, yyyy": lambda r, d: f"{MONTHS[d.month - 1]} {ordinal(d.day)}, {d.year}",
    "Weekday, d Month yyyy": lambda r, d: f"{WEEKDAYS[d.weekday()]}, {d.day} {MONTHS[d.month - 1]} {d.year}",
    "Wkd, d Mon yyyy": lambda r, d: (
        f"{WEEKDAYS[d.weekday()][:3]}, {_day(r, d, 0.3)} {MONTHS[d.month - 1][:3]} {d.year}"
    ),
    "Weekday, Month d, yyyy": lambda r, d: (
        f"{WEEKDAYS[d.weekday()]}, {MONTHS[d.month - 1]} {d.day}, {d.year}"
    ),
    "yyyy年m月d日": lambda r, d: f"{d.year}年{d.month}月{d.day}日",
}
# Letters of the word forms are also seen in lower case ("21 nov 2026") this often.
P_LOWER = 0.1


def dates(rng: random.Random) -> Example:
    """A date between 1900-01-01 and 2099-12-31 written one of the DATE_FORMATS ways -> ISO."""
    day = FIRST_DAY + dt.timedelta(days=rng.randrange((LAST_DAY - FIRST_DAY).days + 1))
    fmt = rng.choice(list(DATE_FORMATS.values()))
    src = fmt(rng, day)
    if rng.random() < P_LOWER:
        src = src.lower()
    return src, day.isoformat()


_MONTH_BY_PREFIX = {m[:3].lower(): i + 1 for i, m in enumerate(MONTHS)}
_WEEKDAY_BY_PREFIX = {w[:3].lower(): i for i, w in enumerate(WEEKDAYS)}
_DATE_PATTERNS = (  # named groups: w (weekday, optional), d, m or mon, y
    re.compile(r"^(?P<d>\d{1,2})(?P<sep>[/.\-])(?P<m>\d{1,2})(?P=sep)(?P<y>\d{4})$"),
    re.compile(r"^(?:(?P<w>[a-z]+), )?(?P<d>\d{1,2})(?:st|nd|rd|th)? (?P<mon>[a-z]+) (?P<y>\d{4})$"),
    re.compile(r"^(?:(?P<w>[a-z]+), )?(?P<mon>[a-z]+) (?P<d>\d{1,2})(?:st|nd|rd|th)?, (?P<y>\d{4})$"),
    re.compile(r"^(?P<y>\d{4})年(?P<m>\d{1,2})月(?P<d>\d{1,2})日$"),
)


def parse_date(src: str) -> dt.date:
    """Read any DATE_FORMATS string back; ValueError for anything else (or a wrong weekday)."""
    text = src.strip().lower()
    for pattern in _DATE_PATTERNS:
        m = pattern.match(text)
        if not m:
            continue
        parts = m.groupdict()
        month = int(parts["m"]) if parts.get("m") else _month(parts["mon"])
        day = dt.date(int(parts["y"]), month, int(parts["d"]))
        if parts.get("w") and _weekday(parts["w"]) != day.weekday():
            raise ValueError(f"{src!r}: {parts['w']} is not the weekday of {day.isoformat()}")
        return day
    raise ValueError(f"not a date this task writes: {src!r}")


def _month(word: str) -> int:
    key = word[:3]
    if key not in _MONTH_BY_PREFIX or not MONTHS[_MONTH_BY_PREFIX[key] - 1].lower().startswith(word):
        raise ValueError(f"unknown month {word!r}")
    return _MONTH_BY_PREFIX[key]


def _weekday(word: str) -> int:
    key = word[:3]
    if key not in _WEEKDAY_BY_PREFIX or not WEEKDAYS[_WEEKDAY_BY_PREFIX[key]].lower().startswith(word):
        raise ValueError(f"unknown weekday {word!r}")
    return _WEEKDAY_BY_PREFIX[key]


def answer_dates(src: str) -> str:
    return parse_date(src).isoformat()


# -- numbers ----------------------------------------------------------------------------

ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
MAX_NUMBER = 999_999


def _below_100(n: int) -> str:
    if n < 20:
        return ONES[n]
    tens, unit = divmod(n, 10)
    return TENS[tens] + (f"-{ONES[unit]}" if unit else "")


def _below_1000(n: int) -> list[str]:
    hundreds, rest = divmod(n, 100)
    words = [ONES[hundreds], "hundred"] if hundreds else []
    return words + ([_below_100(rest)] if rest else [])


def number_words(n: int) -> str:
    """0..999,999 -> English words, no 'and', hyphenated 21..99: 1987 -> one thousand nine hundred eighty-seven."""
    if not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"{n} is outside 0..{MAX_NUMBER}")
    if n == 0:
        return "zero"
    thousands, rest = divmod(n, 1000)
    words = (_below_1000(thousands) + ["thousand"]) if thousands else []
    return " ".join(words + _below_1000(rest))


def number_vocab() -> list[str]:
    """Every word number_words can write (the target vocabulary)."""
    return ONES + TENS[2:] + [_below_100(n) for n in range(21, 100) if n % 10] + ["hundred", "thousand"]


def numbers(rng: random.Random) -> Example:
    """An integer 0..999,999 in digits -> English words.

    The number of digits is uniform in 1..6 (so short numbers are common), and half the
    time each digit after the first is zeroed with probability 1/2 (round numbers such
    as 20,000 or 101 are common too).
    """
    k = rng.randint(1, 6)
    digits = [rng.randint(1 if k > 1 else 0, 9)] + [rng.randint(0, 9) for _ in range(k - 1)]
    if rng.random() < 0.5:
        digits = digits[:1] + [0 if rng.random() < 0.5 else x for x in digits[1:]]
    n = int("".join(map(str, digits)))
    return str(n), number_words(n)


def answer_numbers(src: str) -> str:
    if not src.isdigit():
        raise ValueError(f"not a number in digits: {src!r}")
    return number_words(int(src))


# -- brackets ---------------------------------------------------------------------------

PAIRS = {")": "(", "]": "[", "}": "{"}
OPENERS, CLOSERS = "([{", ")]}"
BRACKETS = "()[]{}"
MAX_BRACKETS = 40
LABELS = ("unbalanced", "balanced")  # class ids 0, 1
EDITS = ("change", "swap", "insert", "delete")


def is_balanced(s: str) -> bool:
    """The stack check: every closer matches the last open bracket, none left open."""
    stack: list[str] = []
    for c in s:
        if c in OPENERS:
            stack.append(c)
        elif c in PAIRS:
            if not stack or stack.pop() != PAIRS[c]:
                return False
        else:
            raise ValueError(f"not a bracket: {c!r}")
    return not stack


def prefix_states(s: str) -> tuple[list[int], list[bool]]:
    """Per position i: (opens - closes) over s[:i+1], and whether s[:i+1] is still a valid prefix
    (no closer so far met a wrong or missing opener). Training-time hints for the classifier."""
    stack: list[str] = []
    depth, ok = 0, True
    depths, valid = [], []
    for c in s:
        if c in OPENERS:
            depth += 1
            stack.append(c)
        else:
            depth -= 1
            ok = ok and bool(stack) and stack.pop() == PAIRS[c]
        depths.append(depth)
        valid.append(ok)
    return depths, valid


def bracket_partners(s: str) -> list[int | None]:
    """Per position, the bracket it pairs with, by type-agnostic nesting level (types ignored):
    a closer's partner is the nearest earlier bracket on its level, an opener's the nearest
    later one; None where there is none. In a balanced string these are the matching pairs;
    a string is balanced iff every bracket has a partner of the other direction and same type."""
    level, depth = [], 0
    for c in s:
        if c in OPENERS:
            depth += 1
            level.append(depth)
        else:
            level.append(depth)
            depth -= 1
    partner: list[int | None] = [None] * len(s)
    last: dict[int, int] = {}  # level -> latest position seen on it
    for i, c in enumerate(s):
        if c in CLOSERS and level[i] in last:
            j = partner[i] = last[level[i]]
            if s[j] in OPENERS and partner[j] is None:
                partner[j] = i
        last[level[i]] = i
    return partner


def _completions(n: int) -> list[list[int]]:
    """ways[r][h]: bracket-direction strings of length r that take depth h back to 0, never below."""
    ways = [[0] * (n + 2) for _ in range(n + 1)]
    ways[0][0] = 1
    for r in range(1, n + 1):
        for h in range(n + 1):
            ways[r][h] = ways[r - 1][h + 1] + (ways[r - 1][h - 1] if h else 0)
    return ways


_WAYS = _completions(MAX_BRACKETS + 2)


def random_balanced(rng: random.Random, n_pairs: int) -> str:
    """A balanced string of n_pairs pairs: shape uniform over all Dyck words, types uniform."""
    out: list[str] = []
    stack: list[str] = []
    for r in range(2 * n_pairs, 0, -1):
        h = len(stack)
        if rng.random() < _WAYS[r - 1][h + 1] / _WAYS[r][h]:
            c = rng.choice(OPENERS)
            stack.append(c)
            out.append(c)
        else:
            out.append(CLOSERS[OPENERS.index(stack.pop())])
    return "".join(out)


def unbalance(rng: random.Random, s: str, edit: str) -> str:
    """One edit of a balanced string that leaves it unbalanced (redrawn until it does).

    swap: half the time two brackets of the same direction but different types
    ("([])" -> "([)]"), which keeps every count and the depth profile intact.
    """
    for _ in range(100):
        i = rng.randrange(len(s))
        if edit == "change":
            t = s[:i] + rng.choice(BRACKETS.replace(s[i], "")) + s[i + 1 :]
        elif edit == "insert":
            i = rng.randrange(len(s) + 1)
            t = s[:i] + rng.choice(BRACKETS) + s[i:]
        elif edit == "delete":
            t = s[:i] + s[i + 1 :]
        elif edit == "swap":
            same_dir = rng.random() < 0.5
            group = OPENERS if s[i] in OPENERS else CLOSERS
            js = [j for j in range(len(s)) if s[j] != s[i] and (not same_dir or s[j] in group)]
            if not js:
                continue
            j = rng.choice(js)
            a, b = min(i, j), max(i, j)
            t = s[:a] + s[b] + s[a + 1 : b] + s[a] + s[b + 1 :]
        else:
            raise ValueError(f"unknown edit {edit!r}")
        if t and not is_balanced(t):
            return t
    raise RuntimeError(f"could not unbalance {s!r} with {edit}")


def brackets(rng: random.Random, max_chars: int = MAX_BRACKETS) -> Example:
    """Half balanced strings of ()[]{} (up to max_chars), half one edit away from balanced."""
    if rng.random() < 0.5:
        return random_balanced(rng, rng.randint(1, max_chars // 2)), LABELS[1]
    edit = rng.choice(EDITS)
    most = (max_chars - 1) // 2 if edit == "insert" else max_chars // 2
    base = random_balanced(rng, rng.randint(1, most))
    return unbalance(rng, base, edit), LABELS[0]


def answer_brackets(src: str) -> str:
    return LABELS[int(is_balanced(src))]


# -- registry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    name: str
    sample: Callable[[random.Random], Example]  # one example from an rng
    answer: Callable[[str], str]  # the right output for a source (exact checker)
    kind: str  # "seq2seq" or "classify"
    src_tokens: tuple[str, ...]  # source vocabulary (characters)
    tgt_tokens: tuple[str, ...] = ()  # target vocabulary (chars or words); () for classifiers
    tgt_level: str = "char"  # "char" or "word"
    labels: tuple[str, ...] = ()  # class names, id order, for classifiers
    max_src: int = 0  # longest source in tokens (EOS not counted)
    max_tgt: int = 0  # longest target in tokens (EOS not counted)
    summary: str = ""  # one line for `python -m attnscope models`
    attention: str = ""  # what the right attention looks like (for the card)


def _chars(*texts: str) -> tuple[str, ...]:
    return tuple(sorted({c for t in texts for c in t}))


_DATE_TEXT = " ".join(MONTHS + WEEKDAYS) + " stndrdth ,/.-年月日" + string.digits
TASKS: dict[str, Task] = {
    "reverse": Task(
        "reverse",
        reverse,
        answer_reverse,
        "seq2seq",
        tuple(string.ascii_lowercase),
        tuple(string.ascii_lowercase),
        max_src=20,
        max_tgt=20,
        summary="reverses lowercase strings of 1-20 letters (hello -> olleh)",
        attention="Cross-attention is an anti-diagonal: output character t reads source "
        "character n-1-t (n = length of the input). The EOS step reads the source EOS.",
    ),
    "sort": Task(
        "sort",
        sort_digits,
        answer_sort,
        "seq2seq",
        tuple(string.digits),
        tuple(string.digits),
        max_src=20,
        max_tgt=20,
        summary="sorts strings of 1-20 digits ascending (3141 -> 1134)",
        attention="Cross-attention of the step that writes digit d goes to the source "
        "positions holding d (and, once every d is written, on to the next larger digit), "
        "so each row of the map picks out the copies of one digit value.",
    ),
    "dates": Task(
        "dates",
        dates,
        answer_dates,
        "seq2seq",
        _chars(_DATE_TEXT, _DATE_TEXT.lower()),
        tuple(string.digits + "-"),
        max_src=max(len(f(random.Random(0), dt.date(2026, 9, 23))) for f in DATE_FORMATS.values()),
        max_tgt=10,
        summary="reads dates as humans write them (21 Nov 2026, 2026年11月21日, ...) -> ISO 2026-11-21",
        attention="Cross-attention is a re-ordering by field: the four year digits of the output "
        "read the year in the source, the two month digits read the month name (its first "
        "letters) or number, the two day digits read the day; a weekday name, ordinal "
        "suffixes and punctuation get little attention.",
    ),
    "numbers": Task(
        "numbers",
        numbers,
        answer_numbers,
        "seq2seq",
        tuple(string.digits),
        tuple(number_vocab()),
        tgt_level="word",
        max_src=6,
        max_tgt=7,
        summary="writes integers 0-999,999 in English words (1987 -> one thousand nine hundred eighty-seven)",
        attention="Cross-attention follows place value: each word reads the digit it spells "
        "(the hundreds digit for 'nine hundred', the tens and units digits for 'eighty-seven'), "
        "and 'thousand' reads the end of the thousands group; zero digits are skipped.",
    ),
    "brackets": Task(
        "brackets",
        brackets,
        answer_brackets,
        "classify",
        tuple(BRACKETS),
        labels=LABELS,
        max_src=MAX_BRACKETS,
        summary="classifies strings of ()[]{} (up to 40) as balanced or unbalanced",
        attention="Encoder self-attention follows the stack algorithm: a head that spreads evenly over "
        "the prefix up to each position (a lower triangle: it counts the depth), and a head that links "
        "each bracket with its partner, a closer with its matching opener and back (arcs over the "
        "nesting). A string is unbalanced where a partner has the wrong type or a bracket has none.",
    ),
}


def get(name: str) -> Task:
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}")
    return TASKS[name]


def generate(name: str, n: int, seed: int) -> list[Example]:
    """n examples of a task from a fresh random.Random(seed) (same seed -> same list)."""
    task, rng = get(name), random.Random(seed)
    return [task.sample(rng) for _ in range(n)]


def check(name: str, src: str, output: str) -> bool:
    """Exactly right? (compared with the task's reference answer for src)."""
    return output == get(name).answer(src)


# -- the held-out split -------------------------------------------------------------------


def split_key(name: str, src: str) -> str:
    """What decides an input's side: the day for dates (every way of writing one day goes to the
    same side), the source text for every other task."""
    return answer_dates(src) if name == "dates" else src


def is_heldout(name: str, src: str) -> bool:
    """True when ``src`` lies in the held-out part of task ``name`` (a stable hash, the same on
    every machine and Python version: blake2b of "task NUL key")."""
    digest = hashlib.blake2b(f"{name}\0{split_key(name, src)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 1000 < HELDOUT_PER_MILLE


def training_stream(name: str, seed: int) -> Iterator[Example]:
    """Endless training examples from random.Random(seed): the generator's draws, minus those
    on the held-out side (redrawn)."""
    task, rng = get(name), random.Random(seed)
    while True:
        example = task.sample(rng)
        if not is_heldout(name, example[0]):
            yield example


def heldout_set(name: str, n: int, seed: int = EVAL_SEED, max_draws: int = 2_000_000) -> list[Example]:
    """n distinct held-out inputs, in the order the generator draws them from random.Random(seed).
    Distinct, so that a common short input (the generator draws "7" often) counts once."""
    task, rng = get(name), random.Random(seed)
    out: dict[str, str] = {}
    for _ in range(max_draws):
        src, tgt = task.sample(rng)
        if src not in out and is_heldout(name, src):
            out[src] = tgt
            if len(out) == n:
                return list(out.items())
    raise ValueError(f"{name}: only {len(out)} distinct held-out inputs in {max_draws:,} draws")
