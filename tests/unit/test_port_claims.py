"""A launch port is claimed machine-wide (pytest_specdecode.servers.ports.claim): two sessions
that do not share a state directory (two users, or the plugin's own tests, one state directory
each) are never handed the same port while its server starts, and a claim ends with the process
that held it.

Each process below chooses with ``find_free_port`` as a launch does, then holds its claim until
its stdin closes. Nothing binds the chosen ports meanwhile, which is the window being tested: a
server that has not bound its port yet.
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pytest_specdecode.servers.launcher import find_free_port
from pytest_specdecode.servers.ports import CLAIMS_KEPT, claim, claims_available, release_claims

pytestmark = pytest.mark.skipif(not claims_available(), reason="claims need Linux")

CHOOSER = """
import sys
from pytest_specdecode.servers.launcher import find_free_port
low, high = int(sys.argv[1]), int(sys.argv[2])
try:
    print(find_free_port("127.0.0.1", port_range=(low, high), attempts=400), flush=True)
except OSError as exc:
    print(f"none: {exc}", flush=True)
sys.stdin.read()  # hold the claim until the test closes stdin
"""


@contextmanager
def choosers(count: int, low: int, high: int) -> Iterator[list[str]]:
    """``count`` processes, started together, each choosing a port in ``low..high``; yields
    what each printed (a port, or "none: ..."), their claims still held."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHOOSER, str(low), str(high)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        assert all(p.stdout is not None for p in procs)
        yield [p.stdout.readline().strip() for p in procs if p.stdout is not None]
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in procs:
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_block(size: int) -> int:
    """The first port of ``size`` consecutive ports that are free and claimed by nobody now."""
    rng = random.Random()
    for _ in range(200):
        low = rng.randint(21000, 30000)  # outside the SGLang range the rest of the suite uses
        if all(bindable(p) for p in range(low, low + size)):
            return low
    raise AssertionError(f"no {size} consecutive free ports found")


def test_processes_choosing_at_once_are_handed_different_ports() -> None:
    # Eight sessions choose among eight free ports at the same moment, none binding its port:
    # without the claim, each draws at random among ports that all look free.
    low = free_block(8)
    with choosers(8, low, low + 7) as chosen:
        assert all(c.isdigit() for c in chosen), chosen
        assert sorted(int(c) for c in chosen) == list(range(low, low + 8))


def test_a_claimed_port_is_not_handed_out_until_its_holder_exits() -> None:
    low = free_block(1)
    with choosers(1, low, low) as first:
        assert first == [str(low)]
        with choosers(1, low, low) as second:
            assert second[0].startswith("none: no free port in "), second
            assert "claimed" in second[0]
    # the holder has exited: its claim went with it
    with choosers(1, low, low) as third:
        assert third == [str(low)]


def test_a_process_may_claim_its_own_port_again_and_keeps_a_bounded_number() -> None:
    low = free_block(CLAIMS_KEPT + 1)
    try:
        assert claim(low)
        assert claim(low)  # its earlier server is gone or bound: the caller checks the port
        for port in range(low + 1, low + CLAIMS_KEPT + 1):
            assert claim(port)
        # the oldest claim was dropped to keep CLAIMS_KEPT: another process may now take it
        with choosers(1, low, low) as other:
            assert other == [str(low)]
        with choosers(1, low + CLAIMS_KEPT, low + CLAIMS_KEPT) as newest:
            assert newest[0].startswith("none: "), newest
    finally:
        release_claims()


def test_find_free_port_without_a_range_claims_what_the_os_gave() -> None:
    port = find_free_port("127.0.0.1")
    try:
        with choosers(1, port, port) as other:
            assert other[0].startswith("none: "), other
    finally:
        release_claims()
