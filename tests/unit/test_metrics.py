"""Run metrics on hand-built run records with hand-computed expectations."""

from __future__ import annotations

import pytest

from pytest_specdecode.errors import RequestError
from pytest_specdecode.metrics import METRICS, RunMetrics, compute_run_metrics
from pytest_specdecode.request_log import RequestRecord, RunRecord


def request(
    t_start: float,
    chunks: list[tuple[float, int]],
    *,
    streamed: bool = True,
    verify: int | None = None,
) -> RequestRecord:
    """A request whose chunks arrived at the given times with the given cumulative tokens."""
    times = tuple(t for t, _ in chunks)
    tokens = tuple(n for _, n in chunks)
    return RequestRecord(
        prompt_kind="code",
        prompt_tokens=50,
        completion_tokens=tokens[-1],
        cached_tokens=0,
        t_start=t_start,
        t_first_token=times[0] if streamed else None,
        t_end=times[-1],
        chunk_times=times,
        chunk_tokens=tokens,
        spec_verify_ct=verify,
        spec={},
        finish_reason="length",
        server_e2e_latency=None,
    )


def run(*records: RequestRecord, t_start: float = 0.0, t_end: float | None = None) -> RunRecord:
    end = max(r.t_end for r in records) if t_end is None else t_end
    return RunRecord(records=records, t_start=t_start, t_end=end, run_index=4)


def test_tok_s_is_generated_tokens_over_run_wall_time_as_the_seed_measured() -> None:
    # "Run 1/5: 500 tokens in 5.20s = 96.1 tok/s"
    metrics = compute_run_metrics(run(request(0.0, [(0.3, 1), (5.2, 500)]), t_end=5.2))

    assert metrics.values["tok_s"] == pytest.approx(500 / 5.2)
    assert round(metrics.values["tok_s"], 1) == 96.2
    assert (metrics.n_requests, metrics.completion_tokens, metrics.wall_s) == (1, 500, 5.2)
    assert metrics.run_index == 4


def sequential_run() -> RunRecord:
    # Two requests, one after the other; TTFT 0.5 s each, 100 tokens each.
    first = request(0.0, [(0.5, 1), (1.0, 5), (2.5, 100)])
    second = request(2.5, [(3.0, 1), (5.0, 100)])
    return run(first, second, t_end=5.0)


def test_sequential_run_metrics() -> None:
    values = compute_run_metrics(sequential_run()).values

    assert values["tok_s"] == pytest.approx(200 / 5.0)
    # Σ(c-1) = 198 over the decoding time: [0.5, 2.5] and [3.0, 5.0], 4.0 s.
    assert values["decode_tok_s"] == pytest.approx(198 / 4.0)
    assert values["ttft"] == pytest.approx(0.5)
    # Each: (e2e - ttft) / (c - 1) = (2.5 - 0.5) / 99.
    assert values["tpot"] == pytest.approx(2.0 / 99)


def test_itl_splits_each_chunk_gap_over_the_tokens_it_brought() -> None:
    # Samples: 4 x 0.5/4 = 0.125, 95 x 1.5/95, 99 x 2.0/99, sorted: 95 x 0.01579, 99 x 0.0202,
    # 4 x 0.125. p50 sits at rank 98.5 (inside the 0.0202 group), p99 at rank 195.03 (0.125).
    values = compute_run_metrics(sequential_run()).values

    assert values["itl_p50"] == pytest.approx(2.0 / 99)
    assert values["itl_p99"] == pytest.approx(0.125)


def test_itl_percentiles_interpolate_linearly_and_skip_the_first_chunk() -> None:
    # The first chunk's 3 tokens belong to TTFT; then gaps 0.2 s / 2 tokens and 0.3 s / 1 token.
    metrics = compute_run_metrics(run(request(0.0, [(1.0, 3), (1.2, 5), (1.5, 6)])))

    # Samples [0.1, 0.1, 0.3]: p50 = 0.1; p99 at rank 1.98 = 0.1 + 0.98 * 0.2.
    assert metrics.values["itl_p50"] == pytest.approx(0.1)
    assert metrics.values["itl_p99"] == pytest.approx(0.1 + 0.98 * 0.2)


def test_decode_tok_s_of_a_concurrent_run_uses_the_union_of_decoding_intervals() -> None:
    records = (
        request(0.0, [(0.5, 1), (3.0, 101)]),
        request(0.1, [(0.6, 1), (2.0, 51)]),  # inside the first interval
        request(3.5, [(4.0, 1), (5.0, 21)]),  # after a gap with nothing decoding
    )

    values = compute_run_metrics(run(*records)).values

    # Σ(c-1) = 100 + 50 + 20 = 170 over the union of [0.5, 3.0] and [4.0, 5.0]: 3.5 s.
    assert values["decode_tok_s"] == pytest.approx(170 / 3.5)
    assert values["tok_s"] == pytest.approx(173 / 5.0)
    assert values["ttft"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)


def test_a_one_token_request_counts_for_throughput_but_not_for_tpot() -> None:
    records = (request(0.0, [(0.2, 1)]), request(0.2, [(0.5, 1), (1.5, 11)]))

    values = compute_run_metrics(run(*records)).values

    assert values["tpot"] == pytest.approx((1.3 - 0.3) / 10)
    assert values["decode_tok_s"] == pytest.approx(10 / (0.0 + 1.0))


def test_accept_length_is_verify_tokens_per_verify_step_weighted_over_requests() -> None:
    records = (
        request(0.0, [(0.1, 1), (1.0, 11)], verify=5),  # 10 verify tokens / 5 steps = 2.0
        request(1.0, [(1.1, 1), (3.0, 31)], verify=10),  # 30 / 10 = 3.0
    )

    values = compute_run_metrics(run(*records)).values

    # SGLang's definition leaves out each request's first token, which prefill produced.
    assert values["accept_length"] == pytest.approx(40 / 15)
    # The per-request meta_info figure counts it: (11 + 31) / 15.
    assert values["spec_accept_length"] == pytest.approx(42 / 15)


def test_an_always_accepted_draft_reads_steps_plus_one_at_any_output_length() -> None:
    # 2 steps, every draft accepted: 3 tokens per verify step, after the prefill token. This is
    # what real SGLang 0.5.15 logged (accept len 3.00) where meta_info said 64 / 21 = 3.05.
    for tokens in (16, 64, 256):
        steps = (tokens - 1) // 3
        record = request(0.0, [(0.1, 1), (1.0, 1 + 3 * steps)], verify=steps)
        values = compute_run_metrics(run(record)).values
        assert values["accept_length"] == 3.0
        assert values["spec_accept_length"] == pytest.approx((1 + 3 * steps) / steps)


def test_accept_length_is_absent_without_speculation_or_without_any_verify_step() -> None:
    plain = (request(0.0, [(0.1, 1), (1.0, 10)]),)
    never_verified = (request(0.0, [(0.1, 1)], verify=0),)

    assert "accept_length" not in compute_run_metrics(run(*plain)).values
    assert "spec_accept_length" not in compute_run_metrics(run(*plain)).values
    assert "accept_length" not in compute_run_metrics(run(*never_verified)).values


@pytest.mark.parametrize("one_token_verify", [0, None], ids=["reported-0", "omitted-0.5.23"])
def test_a_one_token_request_has_no_verify_step_whether_or_not_it_says_so(
    one_token_verify: int | None,
) -> None:
    # SGLang 0.5.6-0.5.22 report spec_verify_ct = 0 for a request that never reached a verify
    # step; 0.5.23 leaves the spec_* fields out. Both mean 0 steps and 0 verify tokens.
    records = (
        request(0.0, [(0.1, 1)], verify=one_token_verify),
        request(0.2, [(0.3, 1), (1.0, 10)], verify=4),
    )

    values = compute_run_metrics(run(*records)).values

    assert values["accept_length"] == pytest.approx(9 / 4)
    assert values["spec_accept_length"] == pytest.approx(11 / 4)


def test_a_request_that_decoded_without_spec_counts_beside_others_that_have_them_is_an_error() -> (
    None
):
    records = (
        request(0.0, [(0.1, 1), (1.0, 10)], verify=4),
        request(1.0, [(1.1, 1), (2.0, 10)]),
    )

    with pytest.raises(
        RequestError,
        match=r"run 5: 1 of 2 requests produced more than one token without reporting "
        r"spec_verify_ct",
    ):
        compute_run_metrics(run(*records))


def test_non_streaming_runs_have_no_latency_metrics_rather_than_zeros() -> None:
    records = (
        request(0.0, [(2.0, 100)], streamed=False, verify=40),
        request(2.0, [(4.0, 100)], streamed=False, verify=40),
    )

    values = compute_run_metrics(run(*records)).values

    assert set(values) == {"tok_s", "accept_length", "spec_accept_length"}
    assert values["tok_s"] == pytest.approx(50.0)
    assert values["accept_length"] == pytest.approx(198 / 80)
    assert values["spec_accept_length"] == pytest.approx(2.5)


def test_values_follow_the_registry_order() -> None:
    metrics = compute_run_metrics(run(request(0.0, [(0.1, 1), (0.2, 2), (0.3, 3)], verify=2)))

    assert list(metrics.values) == list(METRICS)


@pytest.mark.parametrize(
    "bad_run",
    [
        RunRecord(records=(), t_start=0.0, t_end=1.0, run_index=0),
        RunRecord(records=(request(0.0, [(0.1, 1)]),), t_start=1.0, t_end=1.0, run_index=0),
    ],
    ids=["no requests", "zero wall time"],
)
def test_a_run_without_requests_or_wall_time_is_refused(bad_run: RunRecord) -> None:
    with pytest.raises(ValueError, match="run 1 has"):
        compute_run_metrics(bad_run)


def test_run_metrics_serialise_to_json_shaped_data() -> None:
    metrics = RunMetrics(
        run_index=1, values={"tok_s": 90.0}, n_requests=4, completion_tokens=1024, wall_s=11.4
    )

    assert metrics.to_json() == {
        "run_index": 1,
        "values": {"tok_s": 90.0},
        "n_requests": 4,
        "completion_tokens": 1024,
        "wall_s": 11.4,
    }


def test_metric_registry_names_directions_and_display_units() -> None:
    assert list(METRICS) == [
        "tok_s",
        "decode_tok_s",
        "accept_length",
        "spec_accept_length",
        "ttft",
        "tpot",
        "itl_p50",
        "itl_p99",
    ]
    higher = {name for name, info in METRICS.items() if info.higher_is_better}
    assert higher == {"tok_s", "decode_tok_s", "accept_length", "spec_accept_length"}
    assert all(name == info.name for name, info in METRICS.items())
    assert METRICS["ttft"].unit == "ms"
    assert METRICS["ttft"].display(0.0123) == pytest.approx(12.3)
    assert METRICS["tok_s"].display(88.8) == 88.8
