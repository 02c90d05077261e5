"""The seed's story as a nightly performance suite.

On the GPU box these tests launch the four real profiles of ``specdecode.toml`` (Kimi-K2.5 INT4
at TP8), one server at a time; on a laptop or in CI (no GPU) the same tests run against the
simulated SGLang server and every figure is labelled simulated.

Each test may be at most 3% slower than its own stored baseline, and a speculative profile's
accept length at most 5% shorter: accept length is the early warning (a hidden-state wiring bug
took acceptance from ~47% to ~19% in the seed). The 2-step EAGLE3 profile must also beat the
non-speculative baseline by at least 5%, which is the claim the seed's experiment made.
"""

import pytest

NO_REGRESSION = {"tok_s": -0.03}
NO_REGRESSION_SPEC = {"tok_s": -0.03, "accept_length": -0.05}


@pytest.mark.specdecode("nospec-nccl", workload="seed", **NO_REGRESSION)
def test_no_speculation_nccl_tuned():
    """The reference: no speculation, NCCL tuned (the seed measured 88.8 tok/s)."""


@pytest.mark.specdecode("eagle3-5step", workload="seed", **NO_REGRESSION_SPEC)
def test_eagle3_5step_without_nccl_tuning():
    """EAGLE3 5-step after the NCCL variables were lost (the seed: 71.3 tok/s, -20%)."""


@pytest.mark.specdecode("eagle3-5step-nccl", workload="seed", **NO_REGRESSION_SPEC)
def test_eagle3_5step_nccl_tuned():
    """EAGLE3 5-step with NCCL tuning (the seed: 86.7 tok/s, still 2.4% behind)."""


@pytest.mark.specdecode(
    "eagle3-2step-nccl",
    workload="seed",
    against={"nospec-nccl": {"tok_s": +0.05}},
    **NO_REGRESSION_SPEC,
)
def test_eagle3_2step_nccl_beats_no_speculation():
    """EAGLE3 2-step with NCCL tuning must beat no speculation by 5% (the seed: +5.9%)."""
