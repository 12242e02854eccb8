"""Answer extraction and grading edge cases: boxes, <answer> tags, code fences, tool calls."""

import pytest

from spade_jax.eval import bfcl, extract, math_bench


def test_boxed_nested_braces():
  assert extract.last_boxed(r"so \boxed{\frac{1}{\sqrt{2}}} done") == r"\frac{1}{\sqrt{2}}"
  assert extract.boxed_all(r"\boxed{{a}{b}}") == ["{a}{b}"]


def test_boxed_multiple_takes_last():
  text = r"first \boxed{3}, then \boxed{5}, finally \fbox{7}"
  assert extract.boxed_all(text) == ["3", "5", "7"]
  assert extract.last_boxed(text) == "7"


def test_boxed_unclosed_and_escaped_braces():
  assert extract.last_boxed(r"\boxed{12} and \boxed{unfinished") == "12"
  assert extract.last_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"
  assert extract.last_boxed("no box here") is None


def test_math_grading_uses_last_box_and_math_verify():
  assert math_bench.grade_one("204", r"maybe \boxed{100}, no: \boxed{204}")["score"] == 1.0
  assert math_bench.grade_one("204", r"\boxed{204} no wait \boxed{100}")["score"] == 0.0
  assert math_bench.grade_one(r"\frac{1}{2}", r"\boxed{0.5}")["score"] == 1.0
  assert math_bench.grade_one("204", "204")["score"] == 0.0  # unboxed answers do not count
  assert math_bench.grade_one("204", r"\boxed{}")["score"] == 0.0


def test_answer_tags():
  assert extract.answer_tag("<answer> 42 </answer>") == "42"
  assert extract.answer_tag("<answer>1</answer> then <ANSWER>2</ANSWER>") == "2"
  assert extract.answer_tag("<answer>never closed") is None
  assert extract.answer_tag("<answer>\nmulti\nline\n</answer>") == "multi\nline"


def test_code_fences():
  text = "x\n```text\nnot code\n```\n```python\ndef f():\n  return 1\n```\n```py\nprint(2)\n```"
  assert extract.code_block(text) == "print(2)\n"
  assert extract.code_block("```\nplain\n```") == "plain\n"
  assert extract.code_block("```python\ndef cut_off(") == "def cut_off("
  assert extract.code_block("no fence") is None


def test_choice_letters():
  assert extract.choice_letter(r"thus \boxed{C}") == "C"
  assert extract.choice_letter(r"\boxed{(b)}") == "B"
  assert extract.choice_letter("The answer is (D).") == "D"
  assert extract.choice_letter(r"\boxed{E}") is None
  assert extract.choice_letter("I am not sure") is None


def test_tool_calls_parse_like_bfcl():
  assert bfcl.decode_calls("[cd(folder='a'), ls(a=True)]") == [("cd", {"folder": "a"}),
                                                                ("ls", {"a": True})]
  assert bfcl.decode_calls("cd(folder='a')") == [("cd", {"folder": "a"})]  # brackets added
  assert bfcl.decode_calls("[f(x=-1, y=[1, {'k': (2, 3)}], z=name)]") == [
      ("f", {"x": -1, "y": [1, {"k": (2, 3)}], "z": "name"})]
  assert bfcl.decode_calls("[]") == []
  # As in BFCL, a call without keywords inside an argument is read as its source text: a string.
  assert bfcl.decode_calls("[cd(folder=__import__('os').system('true'))]") == [
      ("cd", {"folder": "__import__('os').system('true')"})]


@pytest.mark.parametrize("bad", [
    "[cd(folder='a'",  # truncated
    "```python\n[cd(folder='a')]\n```",  # fenced (BFCL's decoder fails on this too)
    "I will change directory now.",  # prose
    "[cd(folder=1+1)]",  # expression argument: never evaluated
    "[(lambda: 1)()]",  # call of a computed function
    "[cd(**{'folder': 'a'})]",  # kwargs unpacking
    "[1, 2]",  # not calls
])
def test_malformed_tool_calls_are_decode_errors(bad):
  with pytest.raises(bfcl.DecodeError):
    bfcl.decode_calls(bad)


def test_unknown_and_dotted_functions_never_reach_the_executor():
  entry = {"involved_classes": ["GorillaFileSystem"], "id": "multi_turn_base_0"}
  steps = bfcl.decode_step("[cd(folder='a'), os.system(command='x'), print(x=1)]", entry)
  assert steps == ["cd(folder='a')", "__unknown__:os.system", "__unknown__:print"]
  # String arguments are re-rendered as literals, whatever they contain.
  (call,) = bfcl.decode_step("[echo(content=\"'); import os; ('\")]", entry)
  assert call == "echo(content=\"'); import os; ('\")"
