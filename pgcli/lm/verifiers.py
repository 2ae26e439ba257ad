"""Verifiers and rewards for a user's rows (docs/lm.md, "Rewards and verifiers for your data").

A verifier ``(completion, answer) -> bool`` judges one completion against the row's answer column; ``env.reward``
names one (``exact``, ``math``, ``choice``), a user function ``(prompt, completion, **columns) -> float`` through
``_target_`` (every column of the row other than the prompt reaches it by name, as TRL's ``GRPOTrainer`` passes a
dataset's columns to its reward functions), or a weighted list of both. The first built-in verifier is the checker
(``eval/accuracy``); each term is logged apart (``rollout/reward/<name>``).

The final answer of a completion (:func:`extract_answer`), first found of: the last ``\\boxed{...}`` (nested braces
kept), the text after the last ``####`` (GSM8K), the last ``<answer>...</answer>`` block, the text after the last
"answer is" / "Answer:", the last number (``1,234``, ``-3.5``, ``1/2``).

``math`` compares with Hugging Face's ``math-verify`` (equivalent fractions, LaTeX, units and ``$``/``%`` stripped);
without the package (or with :data:`USE_MATH_VERIFY` off) a plain numeric comparison (commas, fractions and units
stripped, relative tolerance 1e-6) stands in for it.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgcli.envs.spec import resolve_target
from pgcli.errors import ConfigError, PgcliError

USE_MATH_VERIFY = True
"""Verify ``math`` answers with ``math-verify`` when it imports (False: the numeric fallback, as without it)."""
MATH_VERIFY_TIMEOUT_S = 5
"""math-verify's per-expression limit (its signal alarm works on the main thread only; off it, no limit)."""
REL_TOL = 1e-6
"""Relative tolerance of the numeric fallback."""
SKIPPED_COLUMNS = frozenset({"prompt", "completion"})
"""Columns never passed to a reward function by name: they are its positional arguments (TRL drops them too)."""

# --------------------------------------------------------------------------------------------------------------------
# Extracting the final answer
# --------------------------------------------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_IS = re.compile(r"\banswer\s*(?:is\b\s*:?|:)[ \t]*([^\n]*)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_NUMBER = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d*\.\d+|\d+)(?:/\d+)?")


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces close (nested braces kept)."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def _after_hashes(text: str) -> str | None:
    if "####" not in text:
        return None
    rest = text.rpartition("####")[2].strip()
    return rest.splitlines()[0].strip() if rest else None


def _answer_tag(text: str) -> str | None:
    blocks = _ANSWER_TAG.findall(text)
    return blocks[-1].strip() if blocks and blocks[-1].strip() else None


def _answer_is(text: str) -> str | None:
    for match in reversed(list(_ANSWER_IS.finditer(text))):
        value = _SENTENCE_END.split(match.group(1), maxsplit=1)[0].strip().strip("*").strip()
        if value:
            return value
    return None


def marked_answer(text: str) -> str | None:
    """The answer a completion marks as final (``\\boxed{}``, ``####``, ``<answer>``, "answer is"), or None."""
    for find in (_last_boxed, _after_hashes, _answer_tag, _answer_is):
        found = find(text)
        if found:
            return found
    return None


def last_number(text: str) -> str | None:
    """The last number of ``text`` as written (``1,234``, ``-3.5``, ``1/2``), or None."""
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion (module docstring for the order of the rules); None when there is none."""
    return marked_answer(text) or last_number(text)


# --------------------------------------------------------------------------------------------------------------------
# Built-in verifiers: (completion, answer) -> bool
# --------------------------------------------------------------------------------------------------------------------

_QUOTES = ('"', "'", "`")


def normalize(text: str) -> str:
    """Stripped, casefolded, whitespace collapsed, a trailing period and surrounding quotes dropped."""
    out = " ".join(text.split()).casefold()
    while True:
        before = out
        out = out.removesuffix(".").strip()
        if len(out) >= 2 and out[0] == out[-1] and out[0] in _QUOTES:
            out = out[1:-1].strip()
        if out == before:
            return out


def verify_exact(completion: str, answer: str) -> bool:
    """The completion, or its extracted final answer, equals the answer after :func:`normalize`."""
    target = normalize(answer)
    if normalize(completion) == target:
        return True
    extracted = extract_answer(completion)
    return extracted is not None and normalize(extracted) == target


def _math_answer(text: str, *, gold: bool) -> str | None:
    """The expression to compare: the marked answer; else a reference answer whole, a one-line LaTeX completion whole
    (``\\frac{1}{2}``), or the completion's last number."""
    marked = marked_answer(text)
    if marked:
        return marked
    stripped = text.strip()
    if gold or ("\\" in stripped and "\n" not in stripped and len(stripped) <= 64):
        return stripped or None
    return last_number(text)


_UNIT_TAIL = re.compile(r"^(.*?\d)\s*[a-zA-Z%°][\w%°. ]*$")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")


def to_number(text: str) -> float | None:
    """The number ``text`` writes (``$1,234.50``, ``1/2``, ``\\frac{1}{2}``, ``42 dollars``, ``42%``) or None."""
    s = text.strip().strip("$").replace("\\$", "").replace("\\%", "%").replace("\\!", "").replace(",", "").strip()
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s).strip()
    unit = _UNIT_TAIL.match(s)
    if unit:
        s = unit.group(1)
    frac = _FRAC.match(s)
    if frac:
        s = f"{frac.group(1)}{frac.group(2)}/{frac.group(3)}"
    num, slash, den = s.partition("/")
    try:
        value = float(num) / float(den) if slash else float(s)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


def _numeric_equal(completion_answer: str, answer: str) -> bool:
    a, b = to_number(completion_answer), to_number(answer)
    if a is None or b is None:
        return normalize(completion_answer) == normalize(answer)
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)


def _math_verify() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """math-verify's ``parse`` and ``verify``, or None (switched off or not installed)."""
    if not USE_MATH_VERIFY:
        return None
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    return parse, verify


def verify_math(completion: str, answer: str) -> bool:
    """The completion's final answer equals the answer's (``#### 42`` and ``\\boxed{}`` extracted from both) by
    math-verify, or numerically (:func:`to_number`) without it."""
    predicted, gold = _math_answer(completion, gold=False), _math_answer(answer, gold=True)
    if predicted is None or gold is None:
        return False
    backend = _math_verify()
    if backend is None:
        return _numeric_equal(predicted, gold)
    parse, verify = backend
    # math-verify times out with signal.alarm, which only the main thread may set
    limit = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    parsed_gold = parse(_as_latex(gold), parsing_timeout=limit)
    parsed = parse(_as_latex(predicted), parsing_timeout=limit)
    if parsed_gold and parsed and verify(parsed_gold, parsed, timeout_seconds=limit):
        return True
    return _numeric_equal(predicted, gold)


_NUMBER_WITH_UNIT = re.compile(r"^(-?[\d,]*\.?\d+(?:/\d+)?)\s*[A-Za-z][A-Za-z. ]*$")


def _as_latex(answer: str) -> str:
    """An extracted answer as math-verify reads it best: currency signs and a plain number's unit words dropped
    (``$1,234 dollars`` -> ``1,234``), inside ``$...$``."""
    s = answer.strip()
    if len(s) > 1 and s[0] == s[-1] == "$":
        s = s.strip("$")
    s = s.replace("\\$", "").lstrip("$").strip()
    unit = _NUMBER_WITH_UNIT.match(s)
    return f"${unit.group(1) if unit else s}$"


_CHOICE = re.compile(r"^\(?([A-Ja-j])\)?(?:[.):]|\s|$)")
_CHOICE_ALONE = re.compile(r"^\(?([A-J])\)?(?:[.):](?:\s|$)|$)|^\(([a-j])\)|^([a-j])\.?$")


def choice_letter(text: str, *, strict: bool = False) -> str | None:
    """The capital letter A-J that ``text`` opens with (``B``, ``(b)``, ``B.``, ``B) Paris``); ``strict`` (a whole
    completion): a capital alone or followed by ``.`` ``)`` ``:``, or any case in brackets, so "I think" is no
    choice."""
    s = text.strip().strip("*").strip()
    match = (_CHOICE_ALONE if strict else _CHOICE).match(s)
    if not match:
        return None
    return next(g for g in match.groups() if g).upper()


def verify_choice(completion: str, answer: str) -> bool:
    """The completion's multiple-choice letter (``B``, ``(B)``, ``B.``, ``Answer: B``, ``the answer is (b)``,
    ``\\boxed{B}``) is the answer column's (``B`` or ``(B)``)."""
    gold = choice_letter(answer)
    if gold is None:
        return False
    marked = marked_answer(completion)
    letter = choice_letter(marked) if marked else choice_letter(completion, strict=True)
    return letter == gold


VERIFIERS: dict[str, Callable[[str, str], bool]] = {
    "exact": verify_exact,
    "math": verify_math,
    "choice": verify_choice,
}
"""The built-in verifiers ``env.reward`` names."""


def format_ok(pattern: str, completion: str) -> bool:
    """The stripped completion matches ``pattern`` whole (``re.fullmatch``, ``.`` matching newlines too)."""
    return re.fullmatch(pattern, completion.strip(), re.DOTALL) is not None


# --------------------------------------------------------------------------------------------------------------------
# Reward terms and sets (env.reward)
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardTerm:
    """One weighted reward: ``fn(prompt, completion, **columns) -> float``."""

    name: str
    weight: float
    fn: Callable[..., float]


@dataclass(frozen=True)
class VerifierReward:
    """A built-in verifier as a reward term: 1.0 when ``verifier(completion, row[answer_key])`` holds, else 0.0."""

    verifier: Callable[[str, str], bool]
    answer_key: str

    def __call__(self, prompt: str, completion: str, **columns: Any) -> float:
        return self.judge(completion, columns)

    def judge(self, completion: str, row: Mapping[str, Any]) -> float:
        """1.0 or 0.0 for ``completion`` against ``row[answer_key]`` (0.0 when the row has no answer)."""
        answer = row.get(self.answer_key)
        return float(answer is not None and self.verifier(completion, str(answer)))


class RewardSet:
    """The weighted reward terms of ``env.reward`` and the checker behind ``eval/accuracy``."""

    def __init__(
        self, terms: Sequence[RewardTerm], checker: Callable[[str, str], bool] | None, answer_key: str
    ) -> None:
        self.terms: tuple[RewardTerm, ...] = tuple(terms)
        self.checker = checker
        self.answer_key = answer_key

    @property
    def names(self) -> list[str]:
        """The terms' names, in order."""
        return [t.name for t in self.terms]

    def score(
        self, prompts: Sequence[str], completions: Sequence[str], rows: Sequence[Mapping[str, Any]]
    ) -> tuple[list[float], dict[str, list[float]]]:
        """The weighted total of each completion and each term's unweighted values by name (``rows[i]``: problem i's
        columns other than the prompt)."""
        if not len(prompts) == len(completions) == len(rows):
            raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions and {len(rows)} rows")
        parts: dict[str, list[float]] = {}
        for term in self.terms:
            parts[term.name] = [_call(term, p, c, r) for p, c, r in zip(prompts, completions, rows, strict=True)]
        totals = [0.0] * len(prompts)
        for term in self.terms:
            totals = [t + term.weight * v for t, v in zip(totals, parts[term.name], strict=True)]
        return totals, parts

    def correct(self, completion: str, row: Mapping[str, Any]) -> bool:
        """The checker's verdict on ``completion`` against ``row[answer_key]`` (False without a checker)."""
        if self.checker is None or row.get(self.answer_key) is None:
            return False
        return self.checker(completion, str(row[self.answer_key]))


def _call(term: RewardTerm, prompt: str, completion: str, row: Mapping[str, Any]) -> float:
    """``term.fn`` on one completion; a user function's exception goes on, named."""
    if isinstance(term.fn, VerifierReward):  # the whole row: the answers may be a column named "completion"
        return term.fn.judge(completion, row)
    columns = {k: v for k, v in row.items() if k not in SKIPPED_COLUMNS}
    try:
        value = term.fn(prompt, completion, **columns)
    except PgcliError:
        raise
    except Exception as exc:
        raise PgcliError(f"reward function {term.name!r} raised {type(exc).__name__}: {exc}") from exc
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PgcliError(f"reward function {term.name!r} returned {value!r}, not a number") from None


def _resolve_function(target: Any, key: str) -> Callable[..., Any]:
    if not isinstance(target, str):
        raise ConfigError(f"{key}._target_ must be a dotted path module.function (got {target!r})")
    try:
        fn = resolve_target(target)
    except Exception as exc:
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"{key}._target_ {target!r} does not import ({type(exc).__name__}: {detail})") from None
    if not callable(fn):
        raise ConfigError(f"{key}._target_ {target!r} is not callable (got {type(fn).__name__})")
    return fn


def _function_name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", type(fn).__name__))


def _weight(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number (got {value!r}); e.g. 0.5")
    return float(value)


def _column_list(columns: Collection[str]) -> str:
    names = sorted(columns) if isinstance(columns, set | frozenset) else list(columns)
    return ", ".join(names) or "(no columns)"


def _need_answers(name: str, key: str, answer_key: str, columns: Collection[str]) -> None:
    if answer_key not in columns:
        raise ConfigError(
            f"{key}={name} needs the answer column {answer_key!r}; the data has: {_column_list(columns)} "
            "(set env.answer_key to the column that holds the answers)"
        )


def _builtin(name: Any, key: str, answer_key: str, columns: Collection[str]) -> RewardTerm:
    if not isinstance(name, str) or name not in VERIFIERS:
        raise ConfigError(f"{key}: unknown verifier {name!r}; the built-in ones are {', '.join(VERIFIERS)}")
    _need_answers(name, key, answer_key, columns)
    return RewardTerm(name, 1.0, VerifierReward(VERIFIERS[name], answer_key))


def _entry(spec: Any, key: str, answer_key: str, columns: Collection[str]) -> RewardTerm:
    """One term of ``env.reward``: a built-in name, or ``{verifier | _target_, weight?, name?, **kwargs}``."""
    if isinstance(spec, str):
        return _builtin(spec, key, answer_key, columns)
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"{key} must be a verifier ({', '.join(VERIFIERS)}), {{_target_: module.function, ...}} or a list of "
            f"them (got {spec!r})"
        )
    args = dict(spec)
    weight = _weight(args.pop("weight"), f"{key}.weight") if "weight" in args else 1.0
    name = args.pop("name", None)
    if "verifier" in args:
        if "_target_" in args or set(args) != {"verifier"}:
            extra = sorted(k for k in args if k != "verifier")
            raise ConfigError(f"{key}: a verifier takes only weight and name (got also {', '.join(extra)})")
        term = _builtin(args["verifier"], key, answer_key, columns)
    elif "_target_" in args:
        fn = _resolve_function(args.pop("_target_"), key)
        term = RewardTerm(_function_name(fn), 1.0, functools.partial(fn, **args) if args else fn)
    else:
        raise ConfigError(f"{key} needs a verifier ({', '.join(VERIFIERS)}) or a _target_ (got {dict(spec)!r})")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ConfigError(f"{key}.name must be a non-empty string (got {name!r})")
    return RewardTerm(name or term.name, weight, term.fn)


def _format_term(pattern: str, weight: float) -> RewardTerm:
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ConfigError(f"env.format_pattern {pattern!r} is not a valid regular expression ({exc})") from None

    def format_reward(prompt: str, completion: str, **columns: Any) -> float:
        return float(compiled.fullmatch(completion.strip()) is not None)

    return RewardTerm("format", weight, format_reward)


def build_rewards(
    spec: Any,
    *,
    answer_key: str,
    columns: Collection[str],
    format_pattern: str | None = None,
    format_weight: float = 0.0,
) -> RewardSet:
    """The :class:`RewardSet` of ``env.reward`` over rows with ``columns`` (docs/lm.md, "Rewards and verifiers for
    your data"): a verifier name, ``{_target_: module.fn, **kwargs}``, or a list of either (mappings with ``weight``
    and ``name``, a built-in as ``verifier: <name>``); empty: ``exact`` on the answer column; ``rm:<run>``: no terms
    (the learned reward scores). ``format_pattern`` with ``format_weight`` > 0 adds a ``format`` term.

    Raises:
        ConfigError: an unknown verifier, a target that does not import or is not callable, a built-in without the
            answer column, a non-numeric weight, an invalid pattern or two terms of one name.
    """
    terms = _terms(spec, answer_key, columns)
    if format_pattern is not None:
        term = _format_term(format_pattern, _weight(format_weight, "env.format_reward"))
        if term.weight > 0:
            terms.append(term)
    names = [t.name for t in terms]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            f"env.reward: two reward terms are named {', '.join(map(repr, duplicates))}; give each a distinct name: "
            "{_target_: ..., name: other}"
        )
    return RewardSet(terms, _checker(terms, answer_key, columns), answer_key)


def _terms(spec: Any, answer_key: str, columns: Collection[str]) -> list[RewardTerm]:
    if spec is None or (isinstance(spec, Mapping | str) and not spec):
        if answer_key not in columns:
            raise ConfigError(
                f"env.reward is not set and the data has no answer column {answer_key!r} (it has: "
                f"{_column_list(columns)}); set env.answer_key, or env.reward to a _target_ or rm:<run>"
            )
        return [_builtin("exact", "env.reward", answer_key, columns)]
    if isinstance(spec, str) and spec.startswith("rm:"):
        return []
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        if not spec:
            raise ConfigError("env.reward is an empty list; name at least one verifier or _target_")
        return [_entry(entry, f"env.reward[{i}]", answer_key, columns) for i, entry in enumerate(spec)]
    return [_entry(spec, "env.reward", answer_key, columns)]


def _checker(
    terms: Sequence[RewardTerm], answer_key: str, columns: Collection[str]
) -> Callable[[str, str], bool] | None:
    """The first built-in verifier among the terms; else ``exact`` when there are answers; else None."""
    for term in terms:
        if isinstance(term.fn, VerifierReward):
            return term.fn.verifier
    return verify_exact if answer_key in columns else None
