"""Frames and reply checks, without processes: caps, bad JSON, NaN, partial delivery, typing."""

import math
import os

import pytest

from spade_jax.sandbox import protocol
from spade_jax.sandbox.contract import Invalid, Limits, Status, check_reset, check_solution, check_step, extract_code


def _pipe_with(data: bytes):
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    os.set_blocking(r, False)
    return r


def test_round_trip_and_partial_delivery():
    frame = protocol.encode({"obs": "héllo \\boxed{1}", "r": 0.5})
    r, w = os.pipe()
    os.set_blocking(r, False)
    reader = protocol.FrameReader(r, cap=1024)
    for i in range(len(frame)):  # one byte at a time: nothing until the last one
        os.write(w, frame[i:i + 1])
        frames, eof = reader.feed()
        assert eof is False and frames == ([] if i < len(frame) - 1 else [{"obs": "héllo \\boxed{1}", "r": 0.5}])
    os.write(w, frame + frame)
    assert reader.feed()[0] == [{"obs": "héllo \\boxed{1}", "r": 0.5}] * 2
    os.close(w)
    assert reader.feed() == ([], True)
    os.close(r)


def test_cap_is_checked_before_reading_the_body():
    r = _pipe_with(protocol.HEADER.pack(10_000_000) + b"{}")
    with pytest.raises(protocol.FrameTooLarge):
        protocol.FrameReader(r, cap=1 << 20).feed()
    os.close(r)


@pytest.mark.parametrize("body", [b"{", b"\xff\xfe", b'{"r": NaN}', b'{"r": -Infinity}', b"[" * 20_000])
def test_bad_frames_are_rejected(body):
    r = _pipe_with(protocol.HEADER.pack(len(body)) + body)
    with pytest.raises(protocol.FrameError):
        protocol.FrameReader(r, cap=1 << 20).feed()
    os.close(r)


def test_blocking_read_frame():
    r = _pipe_with(protocol.encode([1, "a"]))
    os.set_blocking(r, True)
    assert protocol.read_frame(r) == [1, "a"]
    with pytest.raises(EOFError):
        protocol.read_frame(r)
    os.close(r)


def test_extract_code():
    assert extract_code("intro\n```python\nA = 1\n```\n```python\nB = 2\n```") == "A = 1\n"
    assert extract_code("```py\nx\n```") == "x\n"
    assert extract_code("class XEnv: pass") == "class XEnv: pass"


L = Limits()


def test_step_checks():
    assert check_step(["o", 1, False, True, {"a": [1, "b"]}], L) == ("o", 1.0, False, True, {"a": [1, "b"]})
    bad = [["o", True, False, False, {}], ["o", "1", False, False, {}], ["o", 10.5, False, False, {}],
           ["o", 0.0, 0, False, {}], ["o", 0.0, False, None, {}], ["o", 0.0, False, False, []],
           [1, 0.0, False, False, {}], ["o", 0.0, False, False], "o",
           ["o", {"$unjson": "float('nan')"}, False, False, {}],
           ["o", 0.0, False, False, {"x": {"$unjson": "Evil"}}]]
    for ret in bad:
        with pytest.raises(Invalid) as e:
            check_step(ret, L)
        assert e.value.status is Status.INVALID_RETURN, ret
    with pytest.raises(Invalid) as e:
        check_step(["x" * (L.max_observation_chars + 1), 0.0, False, False, {}], L)
    assert e.value.status is Status.OUTPUT_TOO_LARGE
    with pytest.raises(Invalid) as e:
        check_step(["o", 0.0, False, False, {"k": "v" * L.max_info_bytes}], L)
    assert e.value.status is Status.OUTPUT_TOO_LARGE
    with pytest.raises(OverflowError):
        check_step(["o", 10**400, False, False, {}], L)
    assert math.isfinite(check_step(["o", -10, False, False, {}], L)[1])


def test_reset_and_solution_checks():
    assert check_reset(["obs", {}], L) == ("obs", {})
    for ret in (["", {}], ["  ", {}], ["o"], ["o", None], "o", ["o", {}, 1]):
        with pytest.raises(Invalid):
            check_reset(ret, L)
    assert check_solution(None, L) is None
    assert check_solution(["\\boxed{1}"], L) == ["\\boxed{1}"]
    for sol in ("abc", [1], [["a"]]):
        with pytest.raises(Invalid):
            check_solution(sol, L)
