"""Answer extraction, the built-in rewards (integer, exact, format, math via math-verify),
user reward functions, and scoring with a fallback for rewards that fail."""
from __future__ import annotations

import math
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upslope.config import DataConfig, RewardSpec
from upslope.errors import ConfigError
from upslope.rewards import RewardFn, build_reward_fns, combined, score
from upslope.rewards.builtin import exact_reward, format_reward, integer_reward, math_reward
from upslope.rewards.extract import boxed, extract_integer, integers
from upslope.rewards.user import load_user_function

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# ------------------------------------------------------------------ extraction

STRATEGIES = ("first", "last", "after_equals", "boxed", "after_hashes")


@pytest.mark.parametrize("text, expected", [
    # text: first, last, after_equals, boxed, after_hashes
    ("The answer is 1,234 apples, not 56.", (1234, 56, None, None, None)),
    ("-7 then 8", (-7, 8, None, None, None)),
    ("5 - 3 = 2", (5, 2, 2, None, None)),  # '- 3' with a space is subtraction, not -3
    ("x = -12; y = 4", (-12, 4, 4, None, None)),
    ("So 3 + 4 = 7 and 10 = 2*5", (3, 5, 2, None, None)),  # after the LAST '='
    ("We get \\boxed{-1,000}.", (-1000, -1000, None, -1000, None)),
    ("\\boxed{2} then \\boxed{3 + 4}", (2, 4, None, None, None)),  # last box holds two integers: no answer
    ("\\boxed{\\frac{12}{1}} and 3", (12, 3, None, None, None)),
    ("12 apples.\n#### 1,500\n", (12, 1500, None, None, 1500)),
    ("work: 12 #### -3 extra 9", (12, 9, None, None, -3)),
    ("1,2345 and 12,34", (1, 34, None, None, None)),  # not thousands groups: separate integers
    ("1,000,000 = 10^6", (1000000, 6, 10, None, None)),
    ("no numbers here = none", (None, None, None, None, None)),
    ("", (None, None, None, None, None)),
])
def test_extract_integer_strategies(text, expected):
    assert tuple(extract_integer(text, s) for s in STRATEGIES) == expected


def test_integers_and_boxed():
    assert integers("a 5-3 b -2, 3,000 and 4.") == [5, 3, -2, 3000, 4]  # '5-3' is 5 and 3
    assert boxed("x \\boxed{\\frac{1}{\\sqrt{2}}} y") == "\\frac{1}{\\sqrt{2}}"  # nested braces
    assert boxed("\\boxed{1} \\boxed{22}") == "22"
    assert boxed("\\boxed{unclosed") is None and boxed("no box") is None and boxed("\\boxed") is None
    with pytest.raises(ValueError, match="unknown extraction strategy 'middle'"):
        extract_integer("1", "middle")


@settings(max_examples=60, deadline=None)
@given(nums=st.lists(st.integers(-10**9, 10**9), min_size=1, max_size=6), sep=st.booleans())
def test_integers_round_trip(nums, sep):
    render = (lambda v: f"{v:,}") if sep else str
    text = " and then ".join(render(v) for v in nums)
    assert integers(text) == nums
    assert extract_integer(text, "first") == nums[0] and extract_integer(text, "last") == nums[-1]
    assert extract_integer(f"blah = {render(nums[-1])}", "after_equals") == nums[-1]
    assert extract_integer(f"work {text} #### {render(nums[0])}", "after_hashes") == nums[0]
    assert extract_integer(f"so \\boxed{{{render(nums[-1])}}}.", "boxed") == nums[-1]


@pytest.mark.parametrize("text, expected", [
    ("To find 8 * 1,", None),           # an echo of the question commits to nothing
    ("To find 6 * 6,", None),
    ("54", 54), ("54.", 54), ("-7", -7), ("The answer is -3.", -3),
    ("9 * 6 = 54", 54), ("5 - 3 = 2", 2), ("3\u00d74=12", 12), ("2^3 = 8", 8), ("12 / 4 is 3", 3),
    ("8 x 1 is 8", 8), ("8x1=8", 8), ("6 xylophones", 6), ("I have 3 apples", 3),
    ("1 * 6 equals 6", 6), ("no numbers", None), ("", None),
])
def test_first_result_skips_operands(text, expected):
    assert extract_integer(text, "first_result") == expected


@settings(max_examples=60, deadline=None)
@given(a=st.integers(0, 999), b=st.integers(0, 999), op=st.sampled_from(["*", "+", "-", "x", "\u00d7"]),
       lead=st.sampled_from(["", "To find ", "So, "]))
def test_first_result_never_credits_an_echo(a, b, op, lead):
    """Whatever the operands, repeating the expression (the hack the strict 'first' reward allows on
    a * 1 prompts) extracts nothing, and the expression followed by its result extracts the result."""
    assert extract_integer(f"{lead}{a} {op} {b},", "first_result") is None
    assert extract_integer(f"{lead}{a} {op} {b} = {a * b + 1}", "first_result") == a * b + 1
    assert integer_reward(f"{lead}{a} * 1,", a, {}, extract="first_result") == 0.0
    assert integer_reward(f"{lead}{a} * 1,", a, {}, extract="first") == 1.0  # the hack the option closes


# ------------------------------------------------------------------ built-in rewards


def test_integer_reward_strict_and_lenient():
    text = "I think it is 12, no wait, 14"
    assert integer_reward(text, 14, {}) == 0.0  # strict + first: 12 is the committed answer
    assert integer_reward(text, 14, {}, strict=False) == 1.0  # lenient: any integer equal to the answer
    assert integer_reward(text, 14, {}, extract="last") == 1.0
    assert integer_reward(text, 15, {}, strict=False) == 0.0
    assert integer_reward("The total is 1,000.", "1,000", {}) == 1.0  # separators in both
    assert integer_reward("-42", -42, {}) == 1.0
    assert integer_reward("answer: \\boxed{7}", "7", {}, extract="boxed") == 1.0
    assert integer_reward("answer: 7", "7", {}, extract="boxed") == 0.0  # no box: no answer
    assert integer_reward("no answer", 3, {}) == 0.0


def test_integer_answers_the_reward_can_use():
    """The reference of the `integer` reward: an int, an integral float (4.0 was never matched before:
    int('4.0') failed on every sample), or text with separators; anything else is refused up front."""
    from upslope.rewards.builtin import integer_answer

    assert [integer_answer(a) for a in (7, -42, 4.0, "1,000", " 12 ")] == [7, -42, 4, 1000, 12]
    assert integer_reward("it is 4", 4.0, {}) == 1.0
    for bad in ([4, 5], None, {"x": 1}, True, 2.5, "four", ""):
        with pytest.raises(ValueError):
            integer_answer(bad)


def test_exact_reward():
    assert exact_reward("  Paris \n", "paris", {}) == 1.0
    assert exact_reward("Paris", "paris", {}, case_sensitive=True) == 0.0
    assert exact_reward(" Paris", "Paris", {}, strip=False) == 0.0


def test_format_reward():
    assert format_reward("so \\boxed{3}", None, {}) == 1.0
    assert format_reward("so 3", None, {}) == 0.0
    assert format_reward("so \\boxed{}", None, {}) == 0.0  # empty box does not count
    think = r"<think>.*</think>\s*\S.*"
    assert format_reward("<think>a\nb</think> 42", None, {}, pattern=think, full_match=True) == 1.0
    assert format_reward("pre <think>a</think> 42", None, {}, pattern=think, full_match=True) == 0.0
    assert format_reward("pre <think>a</think> 42", None, {}, pattern=think) == 1.0  # search


@pytest.mark.parametrize("completion, answer, expected", [
    # GSM8K style: references are plain numbers, completions end with '#### N'
    ("She sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", "18", 1.0),
    ("so the total is\n#### 1,800", "1800", 1.0),
    ("#### 17", "18", 0.0),
    ("The answer is \\boxed{18}.", "18", 1.0),
    ("I get 18 dollars", "18", 1.0),  # math-verify falls back to the last number
    ("no idea", "18", 0.0),
    # LaTeX
    ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("The answer is 0.5", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("\\boxed{\\sqrt{51}}", "\\sqrt{51}", 1.0),
    ("\\boxed{7}", "\\sqrt{51}", 0.0),
    ("in polar form \\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
    ("\\boxed{3}", "\\left( 3, \\frac{\\pi}{2} \\right)", 0.0),
    ("\\boxed{\\pi}", "\\pi", 1.0),
    ("$x = \\boxed{3}$", "$3$", 1.0),
])
def test_math_reward(completion, answer, expected):
    assert math_reward(completion, answer, {}) == expected


def test_math_reward_accepts_every_math500_reference_boxed():
    """Each MATH500 reference, boxed verbatim, must verify against itself."""
    from upslope.data.tasks import math500

    examples = math500()
    misses = [e.answer for e in examples if math_reward(f"The final answer is \\boxed{{{e.answer}}}.", e.answer, {}) != 1.0]
    assert misses == []


# ------------------------------------------------------------------ user rewards


USER_FILE = """
def length_bonus(completion, answer, meta, *, scale=1.0):
    return scale * len(completion)

def components(completion, answer, meta):
    return {"has_answer": float(str(answer) in completion), "short": float(len(completion) < 5)}

not_callable = 3

def no_args():
    return 1.0
"""


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(USER_FILE))
    return path


def test_user_reward_from_file(user_file):
    fn = load_user_function(f"{user_file}:length_bonus")
    assert fn("abcd", None, {}) == 4.0
    [rf] = build_reward_fns([RewardSpec(name=f"{user_file}:length_bonus", options={"scale": 0.5}, weight=2.0)])
    assert (rf.name, rf.weight, rf.batched) == ("length_bonus", 2.0, False)
    assert rf.fn("abcd", None, {}) == 2.0


def test_user_reward_from_module():
    fn = load_user_function("upslope.rewards.builtin:exact_reward")
    assert fn is exact_reward
    [rf] = build_reward_fns([RewardSpec(name="upslope.rewards.builtin:format_reward", as_name="fmt")])
    assert rf.name == "fmt" and rf.fn("\\boxed{1}", None, {}) == 1.0


@pytest.mark.parametrize("ref, fragment", [
    ("{file}:missing_fn", "module has no function 'missing_fn'"),
    ("{file}:not_callable", "module has no function 'not_callable'"),
    ("{dir}/nope.py:f", "nope.py not found"),
    ("no_such_pkg_xyz.mod:f", "cannot import module 'no_such_pkg_xyz.mod'"),
    ("just_a_name", "expected a registry name or 'module:function'"),
])
def test_user_reward_errors(user_file, ref, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        load_user_function(ref.format(file=user_file, dir=user_file.parent))


def test_user_reward_file_that_fails_to_import(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import not_a_module_xyz\n")
    with pytest.raises(ConfigError, match="importing .*broken.py failed: ModuleNotFoundError"):
        load_user_function(f"{path}:f")


def test_build_reward_fns_defaults_and_errors():
    [rf] = build_reward_fns([], DataConfig(task="arith"))
    assert rf.name == "integer" and rf.fn.keywords == {"extract": "first_result", "strict": True}
    with pytest.raises(ConfigError, match="no reward configured"):
        build_reward_fns([], DataConfig(path="x.jsonl"))
    with pytest.raises(ConfigError, match=r"reward\[0\].options.strictt: unknown option for reward 'integer'"):
        build_reward_fns([RewardSpec(name="integer", options={"strictt": True})])
    with pytest.raises(ConfigError, match=r"reward\[1\].name: unknown reward 'maths' \(did you mean 'math'\?\)"):
        build_reward_fns([RewardSpec(name="integer"), RewardSpec(name="maths")])


# ------------------------------------------------------------------ scoring


def test_score_combines_weighted_components(user_file):
    fns = build_reward_fns([RewardSpec(name="integer", weight=1.0),
                            RewardSpec(name=f"{user_file}:components", weight=0.5)])
    result = score(fns, ["4", "answer 5", "no"], [4, 4, 4], [{}, {}, {}])
    assert result.components == {"integer": [1.0, 0.0, 0.0],
                                 "components/has_answer": [1.0, 0.0, 0.0],
                                 "components/short": [1.0, 0.0, 1.0]}
    assert result.weights == {"integer": 1.0, "components/has_answer": 0.5, "components/short": 0.5}
    assert result.failures == {} and result.errors == {}
    assert combined(result) == [2.0, 0.0, 0.5]


def test_score_fallback_for_raising_nan_and_none_rewards():
    calls = []

    def flaky(completion, answer, meta):
        calls.append(completion)
        if completion == "boom":
            raise RuntimeError("reward crashed")
        return 1.0

    def nan_reward(completion, answer, meta):
        return math.nan if completion == "nan" else 0.25

    def none_reward(completion, answer, meta):  # forgot to return
        pass

    fns = [RewardFn("flaky", 1.0, flaky), RewardFn("nan", 2.0, nan_reward), RewardFn("none", 1.0, none_reward)]
    completions = ["ok", "boom", "nan", "ok"]
    result = score(fns, completions, [None] * 4, [{}] * 4, fallback=-1.0)
    assert calls == completions  # every sample is still scored after a failure
    assert result.components["flaky"] == [1.0, -1.0, 1.0, 1.0]
    assert result.components["nan"] == [0.25, 0.25, -1.0, 0.25]
    assert result.components["none"] == [-1.0] * 4
    assert result.failures == {"flaky": 1, "nan": 1, "none": 4}
    assert result.errors["flaky"] == "RuntimeError: reward crashed"
    assert result.errors["nan"] == "returned nan" and result.errors["none"] == "returned None"
    assert combined(result) == [1.0 + 0.5 - 1.0, -1.0 + 0.5 - 1.0, 1.0 - 2.0 - 1.0, 1.0 + 0.5 - 1.0]


def test_score_builtin_reward_with_bad_reference_uses_fallback():
    """The integer reward raises on a non-integer reference; the batch goes on."""
    fns = build_reward_fns([RewardSpec(name="integer")])
    result = score(fns, ["3", "3"], ["three", 3], [{}, {}], fallback=0.0)
    assert result.components["integer"] == [0.0, 1.0]
    assert result.failures == {"integer": 1} and result.errors["integer"].startswith("ValueError")


def test_score_batched_reward_failure_counts_every_sample():
    def batched_ok(completions, answers, metas):
        return [float(len(c)) for c in completions]

    def batched_boom(completions, answers, metas):
        raise OSError("sandbox down")

    fns = [RewardFn("len", 1.0, batched_ok, batched=True), RewardFn("code", 1.0, batched_boom, batched=True)]
    result = score(fns, ["a", "bcd"], [None, None], [{}, {}], fallback=0.5)
    assert result.components == {"len": [1.0, 3.0], "code": [0.5, 0.5]}
    assert result.failures == {"code": 2} and result.errors == {"code": "OSError: sandbox down"}
