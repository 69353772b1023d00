"""The zoo's data generators: formats, labels checked independently, seeds, the held-out split."""

from __future__ import annotations

import calendar
import datetime as dt
import itertools
import random
import re
from collections import Counter

import pytest

from attnscope.models import tasks as T

N = 3000


@pytest.fixture(scope="module")
def samples() -> dict[str, list[T.Example]]:
    return {name: T.generate(name, N, 123) for name in T.TASKS}


# -- generic ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(T.TASKS))
def test_same_seed_same_data_other_seed_other_data(name):
    assert T.generate(name, 50, 5) == T.generate(name, 50, 5)
    assert T.generate(name, 50, 5) != T.generate(name, 50, 6)


@pytest.mark.parametrize("name", list(T.TASKS))
def test_sources_fit_vocab_and_length(name, samples):
    task = T.get(name)
    for src, tgt in samples[name]:
        assert set(src) <= set(task.src_tokens), src
        assert 1 <= len(src) <= task.max_src
        if task.kind == "seq2seq":
            pieces = tgt.split() if task.tgt_level == "word" else list(tgt)
            assert set(pieces) <= set(task.tgt_tokens), tgt
            assert 1 <= len(pieces) <= task.max_tgt
        else:
            assert tgt in task.labels


@pytest.mark.parametrize("name", list(T.TASKS))
def test_checker_accepts_label_and_rejects_other_output(name, samples):
    for src, tgt in samples[name][:200]:
        assert T.check(name, src, tgt)
        assert not T.check(name, src, tgt + "x")


def test_seeds_are_distinct():
    assert len({T.TRAIN_SEED, T.VAL_SEED, T.EVAL_SEED}) == 3
    assert T.TRAIN_SEED not in T.RESERVED_SEEDS


def test_training_refuses_reserved_seeds(tmp_path):
    from attnscope.models import train

    for seed in T.RESERVED_SEEDS:
        with pytest.raises(SystemExit):
            train.train("reverse", seed, tmp_path / "x", steps=1)


# -- the held-out split (zero overlap by construction) ---------------------------------------------


@pytest.mark.parametrize("name", list(T.TASKS))
def test_training_never_draws_a_heldout_input(name):
    """Checked against the rule itself, not a sample of the stream: every training draw is on the
    training side and every held-out input on the held-out side, so no input can be in both,
    whatever the seed or the number of steps."""
    heldout = T.heldout_set(name, 1000)
    assert len({s for s, _ in heldout}) == 1000  # distinct
    assert all(T.is_heldout(name, s) and T.check(name, s, t) for s, t in heldout)
    for seed in (T.TRAIN_SEED, 12345):
        drawn = list(itertools.islice(T.training_stream(name, seed), 20_000))
        assert not any(T.is_heldout(name, s) for s, _ in drawn)
        assert not {s for s, _ in heldout} & {s for s, _ in drawn}


@pytest.mark.parametrize("name", list(T.TASKS))
def test_split_holds_about_a_tenth_of_the_input_space(name):
    one_per_key = {T.split_key(name, s): s for s, _ in T.generate(name, 20_000, 99)}  # dates: one per day
    share = sum(T.is_heldout(name, s) for s in one_per_key.values()) / len(one_per_key)
    assert 0.08 < share < 0.12, share


def test_dates_split_by_day_not_by_spelling():
    rng = random.Random(3)
    for _ in range(300):
        day = T.FIRST_DAY + dt.timedelta(days=rng.randrange((T.LAST_DAY - T.FIRST_DAY).days))
        sides = {T.is_heldout("dates", fmt(rng, day)) for fmt in T.DATE_FORMATS.values()}
        assert len(sides) == 1, day  # every way of writing one day is on the same side


def test_heldout_set_is_reproducible_and_seeded():
    assert T.heldout_set("reverse", 50) == T.heldout_set("reverse", 50)
    assert T.heldout_set("reverse", 50) != T.heldout_set("reverse", 50, seed=T.VAL_SEED)


# -- reverse / sort -------------------------------------------------------------------------


def test_reverse_format(samples):
    lengths = Counter()
    for src, tgt in samples["reverse"]:
        assert re.fullmatch(r"[a-z]{1,20}", src)
        assert len(tgt) == len(src) and all(tgt[i] == src[-1 - i] for i in range(len(src)))
        lengths[len(src)] += 1
    assert set(lengths) == set(range(1, 21))


def test_sort_format(samples):
    for src, tgt in samples["sort"]:
        assert re.fullmatch(r"\d{1,20}", src)
        assert Counter(tgt) == Counter(src)
        assert all(a <= b for a, b in zip(tgt, tgt[1:], strict=False))
    assert {len(s) for s, _ in samples["sort"]} == set(range(1, 21))


@pytest.mark.parametrize("name", ["reverse", "sort"])
def test_long_runs_are_common(name, samples):
    """A quarter of the strings use at most 3 symbols, so long runs ("0000099999") are seen in training."""
    few = [s for s, _ in samples[name] if len(s) >= 10 and len(set(s)) <= 3]
    assert 0.05 < len(few) / N < 0.25


# -- dates ----------------------------------------------------------------------------------

# stdlib strptime formats for each way the generator writes a date (ordinal suffixes removed first)
STRPTIME = (
    "%d/%m/%Y",
    "%d.%m.%Y",
    "%d-%m-%Y",
    "%d %b %Y",
    "%d %B %Y",
    "%B %d, %Y",
    "%b %d, %Y",
    "%A, %d %B %Y",
    "%a, %d %b %Y",
    "%A, %B %d, %Y",
    "%Y年%m月%d日",
)


def stdlib_date(src: str) -> dt.date:
    text = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", src)
    for fmt in STRPTIME:
        try:
            return dt.datetime.strptime(text, fmt).date()
        except ValueError:
            continue
    raise AssertionError(f"strptime cannot read {src!r}")


def test_dates_labels_agree_with_strptime_and_weekday_is_right(samples):
    weekdays = [d.lower() for d in calendar.day_name] + [d.lower() for d in calendar.day_abbr]
    n_weekday = 0
    for src, tgt in samples["dates"]:
        day = stdlib_date(src)
        assert tgt == day.isoformat() == T.answer_dates(src)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", tgt)
        assert 1900 <= day.year <= 2099
        first = src.split(",")[0].lower()
        if first in weekdays:
            n_weekday += 1
            assert weekdays.index(first) % 7 == day.weekday(), src
    assert n_weekday > N / 10


REQUIRED_FORMS = {
    "21/11/2026": r"\d{1,2}/\d{1,2}/\d{4}",
    "21.11.2026": r"\d{1,2}\.\d{1,2}\.\d{4}",
    "21-11-2026": r"\d{1,2}-\d{1,2}-\d{4}",
    "21 Nov 2026": r"\d{1,2} [A-Z][a-z]{2} \d{4}",
    "21 November 2026": r"\d{1,2} [A-Z][a-z]{3,} \d{4}",
    "21st November 2026": r"\d{1,2}(st|nd|rd|th) [A-Z][a-z]+ \d{4}",
    "November 21, 2026": r"[A-Z][a-z]{3,} \d{1,2}, \d{4}",
    "Nov 21, 2026": r"[A-Z][a-z]{2} \d{1,2}, \d{4}",
    "Saturday, 21 November 2026": r"[A-Z][a-z]+day, \d{1,2} [A-Z][a-z]+ \d{4}",
    "Sat, 21 Nov 2026": r"[A-Z][a-z]{2}, \d{1,2} [A-Z][a-z]{2} \d{4}",
    "2026年11月21日": r"\d{4}年\d{1,2}月\d{1,2}日",
    "1/2/2026": r"\d/\d/\d{4}",  # unpadded day and month
}


@pytest.mark.parametrize("example", list(REQUIRED_FORMS))
def test_dates_required_forms_are_generated_and_read(example, samples):
    assert re.fullmatch(REQUIRED_FORMS[example], example)
    assert any(re.fullmatch(REQUIRED_FORMS[example], s) for s, _ in samples["dates"])
    assert T.answer_dates(example) == stdlib_date(example).isoformat()


def test_dates_hand_examples():
    assert T.answer_dates("Saturday, 21 November 2026") == "2026-11-21"
    assert T.answer_dates("2026年11月21日") == "2026-11-21"
    assert T.answer_dates("1/2/1900") == "1900-02-01"  # day first, never the US order
    assert T.answer_dates("Dec 31, 2099") == "2099-12-31"
    with pytest.raises(ValueError):
        T.answer_dates("Friday, 21 November 2026")  # 21 Nov 2026 is a Saturday
    with pytest.raises(ValueError):
        T.answer_dates("2026-11-21")


def test_dates_cover_the_whole_range():
    years = [int(t[:4]) for _, t in T.generate("dates", 20_000, 9)]
    assert min(years) < 1905 and max(years) > 2094


# -- numbers --------------------------------------------------------------------------------

SMALL = dict(
    enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen".split()
    )
)
DECADES = {
    2: "twenty",
    3: "thirty",
    4: "forty",
    5: "fifty",
    6: "sixty",
    7: "seventy",
    8: "eighty",
    9: "ninety",
}


def words_reference(digits: str) -> str:
    """An independent reading of a digit string, three digits at a time."""

    def group(g: str) -> list[str]:
        h, t, u = (int(c) for c in g.zfill(3))
        out = [SMALL[h], "hundred"] if h else []
        if 10 * t + u >= 20:
            out.append(DECADES[t] + ("-" + SMALL[u] if u else ""))
        elif 10 * t + u:
            out.append(SMALL[10 * t + u])
        return out

    if int(digits) == 0:
        return "zero"
    high, low = digits[:-3], digits[-3:]
    out = (group(high) + ["thousand"]) if high and int(high) else []
    return " ".join(out + group(low))


def test_numbers_against_independent_reference(samples):
    for src, tgt in samples["numbers"]:
        assert re.fullmatch(r"0|[1-9]\d{0,5}", src)
        assert tgt == words_reference(src)
    assert {len(s) for s, _ in samples["numbers"]} == set(range(1, 7))
    for n in [0, 7, 13, 20, 21, 99, 100, 101, 110, 999, 1000, 1001, 1987, 20_000, 100_100, 999_999]:
        assert T.number_words(n) == words_reference(str(n))


def test_numbers_hand_examples():
    assert T.number_words(1987) == "one thousand nine hundred eighty-seven"
    assert T.number_words(100_100) == "one hundred thousand one hundred"
    assert T.number_words(999_999) == "nine hundred ninety-nine thousand nine hundred ninety-nine"
    with pytest.raises(ValueError):
        T.number_words(1_000_000)


def test_numbers_vocab_covers_every_number():
    vocab = set(T.number_vocab())
    assert all(set(T.number_words(n).split()) <= vocab for n in range(0, 1_000_000, 37))
    assert len(vocab) == len(T.number_vocab())


# -- brackets -------------------------------------------------------------------------------


def stack_ok(s: str) -> bool:
    closer = {"(": ")", "[": "]", "{": "}"}
    want: list[str] = []
    for c in s:
        if c in closer:
            want.append(closer[c])
        elif not want or want.pop() != c:
            return False
    return not want


def counts_say_balanced(s: str) -> bool:
    return all(s.count(a) == s.count(b) for a, b in ("()", "[]", "{}"))


def test_brackets_half_balanced_and_labels_right(samples):
    labels = Counter(t for _, t in samples["brackets"])
    assert abs(labels["balanced"] / N - 0.5) < 0.04
    for src, tgt in samples["brackets"]:
        assert re.fullmatch(r"[()\[\]{}]{1,40}", src)
        assert (tgt == "balanced") == stack_ok(src) == T.is_balanced(src)


def test_brackets_unbalanced_cannot_be_read_off_counts(samples):
    unbalanced = [s for s, t in samples["brackets"] if t == "unbalanced"]
    tricky = [s for s in unbalanced if counts_say_balanced(s)]
    # swaps keep every count; half of them also keep the depth profile ("([])" -> "([)]")
    assert len(tricky) / len(unbalanced) > 0.15
    depth_ok = [s for s in tricky if stack_ok(s.translate(str.maketrans("[]{}", "()()")))]
    assert len(depth_ok) / len(unbalanced) > 0.05
    assert any(len(s) % 2 for s in unbalanced) and any(len(s) % 2 == 0 for s in unbalanced)


@pytest.mark.parametrize("edit", T.EDITS)
def test_every_edit_unbalances(edit):
    rng = random.Random(3)
    for _ in range(300):
        base = T.random_balanced(rng, rng.randint(1, 19))
        assert stack_ok(base)
        edited = T.unbalance(rng, base, edit)
        assert not stack_ok(edited)
        assert abs(len(edited) - len(base)) == (0 if edit in ("change", "swap") else 1)


def test_balanced_lengths_cover_range(samples):
    lengths = {len(s) for s, t in samples["brackets"] if t == "balanced"}
    assert lengths == set(range(2, 41, 2))


def test_bracket_partners_characterise_balance():
    """Exhaustively up to length 8 over two types: balanced iff every bracket's partner exists,
    points the other way and has the same type; in balanced strings partners are the stack's pairs."""
    import itertools

    for n in range(1, 9):
        for chars in itertools.product("()[]", repeat=n):
            s = "".join(chars)
            partners = T.bracket_partners(s)
            ok = all(
                k is not None
                and (s[i] in "([{") != (s[k] in "([{")
                and {s[i], s[k]} in ({"(", ")"}, {"[", "]"})
                for i, k in enumerate(partners)
            )
            assert ok == stack_ok(s), s
            if ok:
                stack = []
                for i, c in enumerate(s):
                    if c in "([":
                        stack.append(i)
                    else:
                        j = stack.pop()
                        assert partners[i] == j and partners[j] == i


def test_prefix_states():
    assert T.prefix_states("([)]") == ([1, 2, 1, 0], [True, True, False, False])
    assert T.prefix_states("())(") == ([1, 0, -1, 0], [True, True, False, False])
    rng = random.Random(4)
    for _ in range(200):
        s = T.random_balanced(rng, rng.randint(1, 20))
        depths, valid = T.prefix_states(s)
        assert all(valid) and depths[-1] == 0 and min(depths) >= 0
