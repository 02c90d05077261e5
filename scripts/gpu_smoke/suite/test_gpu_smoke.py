"""gpu-smoke: real SGLang with models whose accept lengths are known exactly.

tiny-eagle3-match proposes the token the target always emits (accept length 3.00 for 2 steps,
topk 1, 3 draft tokens); tiny-eagle3-miss never does (1.00). Throughput may vary between
launches (12% was seen between two launches of one profile on an H200), hence the wide margin.
"""

import pytest

TOK_S = -0.25


@pytest.mark.specdecode("smoke-nospec", workload="smoke", tok_s=TOK_S)
def test_nospec():
    """No speculation: the throughput reference."""


@pytest.mark.specdecode("smoke-eagle3-match", workload="smoke", tok_s=TOK_S, accept_length=-0.01)
def test_eagle3_match(specdecode):
    """Every draft token accepted: SGLang's accept length is steps + 1."""
    specdecode.measure()
    assert round(specdecode.mean("accept_length"), 2) == 3.00


@pytest.mark.specdecode("smoke-eagle3-miss", workload="smoke", tok_s=TOK_S, accept_length=-0.01)
def test_eagle3_miss(specdecode):
    """No draft token accepted: accept length 1."""
    specdecode.measure()
    assert round(specdecode.mean("accept_length"), 2) == 1.00
