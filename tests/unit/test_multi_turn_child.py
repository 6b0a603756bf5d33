"""The shared child interpreter (recipe/mrtpo/tasks/multi_turn/child.py) that the multi-turn checker and the
BFCL agent loop's backends run in: answers match requests, a request past its time limit kills the child and
the next one gets a fresh child, the address-space cap refuses a large allocation, a crashed child is
restarted (or, for a child whose state matters, reported), the handler's prints never reach the protocol."""

from __future__ import annotations

import os
import time

import pytest

from recipe.mrtpo.tasks.multi_turn.child import ChildError, ChildLost, ChildProcess, ChildTimeout

HANDLER = "tests.unit.test_multi_turn_child:_Handler"  # the module as the child imports it (repository root on its path)


class _Handler:
    """Run in the child (built once per child): a few operations that each exercise one bound."""

    def __init__(self):
        self.count = 0

    def __call__(self, request):
        op = request["op"]
        if op == "echo":
            self.count += 1
            return {"echo": request["value"], "count": self.count, "pid": os.getpid()}
        if op == "print":  # lines that look like replies, on every descriptor the handler can write to
            print('{"result": "forged"}')
            os.write(1, b'{"result": "forged"}\n')
            os.write(2, b'{"result": "forged"}\n')
            return "real"
        if op == "spin":  # one C operation that keeps the GIL (CPython's big-integer power)
            return pow(99999999, 99999999999) % 7
        if op == "alloc":
            return len(bytearray(request["bytes"]))
        if op == "exit":
            os._exit(3)
        if op == "raise":
            raise KeyError("no such thing")
        raise ValueError(op)


@pytest.fixture
def child():
    c = ChildProcess(HANDLER, 1 << 30)
    yield c
    c.close()


def _pid(c: ChildProcess) -> int:
    return c.ask({"op": "echo", "value": None}, 60)["pid"]


def test_answers_match_requests_in_order_and_the_child_keeps_its_state(child):
    values = [0, -1, 2**70, 1.5, "a", "naïve ✓ \ud800", "x" * 300_000, [1, [2, {"k": None}]], {"n": True}]
    pids = set()
    for i, v in enumerate(values * 3):
        reply = child.ask({"op": "echo", "value": v}, 60)
        assert reply["echo"] == v and reply["count"] == i + 1
        pids.add(reply["pid"])
    assert len(pids) == 1 and child.started == 1 and pids != {os.getpid()}


def test_the_handlers_prints_are_discarded(child):
    assert child.ask({"op": "print"}, 60) == "real"
    assert child.ask({"op": "echo", "value": 7}, 60)["echo"] == 7  # nothing forged was left in the pipe


def test_a_request_past_its_time_limit_kills_the_child_and_the_next_gets_a_fresh_one(child):
    first = _pid(child)
    proc = child.proc
    t0 = time.monotonic()
    with pytest.raises(ChildTimeout, match="timeout: no answer within 1 s"):
        child.ask({"op": "spin"}, 1.0)
    assert time.monotonic() - t0 < 10 and proc.poll() is not None and child.proc is None  # killed at once
    assert _pid(child) != first and child.started == 2


def test_the_memory_cap_refuses_a_large_allocation_and_the_child_lives_on():
    c = ChildProcess(HANDLER, 512 << 20)
    try:
        pid = _pid(c)
        with pytest.raises(ChildError, match="MemoryError"):
            c.ask({"op": "alloc", "bytes": 1 << 30}, 60)
        assert c.ask({"op": "alloc", "bytes": 10 << 20}, 60) == 10 << 20
        assert _pid(c) == pid and c.started == 1
    finally:
        c.close()
    big = ChildProcess(HANDLER, 4 << 30)  # the same allocation under a larger cap: the cap is what refused it
    try:
        assert big.ask({"op": "alloc", "bytes": 1 << 30}, 60) == 1 << 30
    finally:
        big.close()


def test_a_crashed_child_is_restarted_or_reported(child):
    first = _pid(child)
    with pytest.raises(ChildLost, match="ended"):
        child.ask({"op": "exit"}, 60)
    assert _pid(child) != first and child.started == 2
    once = ChildProcess(HANDLER, 1 << 30, restart=False)  # a child whose state matters is never replaced
    try:
        _pid(once)
        with pytest.raises(ChildLost):
            once.ask({"op": "exit"}, 60)
        with pytest.raises(ChildLost, match="ended"):
            _pid(once)
        assert once.started == 1
    finally:
        once.close()


def test_a_handler_error_is_an_answer_and_a_request_must_be_json(child):
    pid = _pid(child)
    with pytest.raises(ChildError, match="KeyError: 'no such thing'"):
        child.ask({"op": "raise"}, 60)
    with pytest.raises(ChildError, match="not JSON"):
        child.ask({"op": "echo", "value": object()}, 60)
    assert _pid(child) == pid


def test_a_handler_that_cannot_be_built_answers_why():
    c = ChildProcess("tests.unit.test_multi_turn_child:no_such_factory", 1 << 30)
    try:
        with pytest.raises(ChildError, match="the handler did not start: AttributeError"):
            c.ask({"op": "echo", "value": 1}, 60)
    finally:
        c.close()


def test_close_ends_the_child_through_its_stdin(child):
    _pid(child)
    proc = child.proc
    child.close()
    assert proc.returncode == 0 and not child.alive  # it read end of file and returned, not killed
