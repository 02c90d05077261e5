"""``return_logprob`` on ``/generate``: SGLang 0.5.6's ``meta_info`` logprob fields.

SGLang's ``sgl.select`` reads them (test_sim_sglang_clients.py runs it); the shapes are pinned
here without SGLang's client venv.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import EAGLE3_2STEP, SimProcess, StartSim, stream_json

PROMPT = "Is Paris the capital city of France?"
#: The sim's tokenizer: BOS, then one token per word or punctuation mark.
PIECES = ["<s>", "Is", "Paris", "the", "capital", "city", "of", "France", "?"]


@pytest.fixture(scope="module")
def sim(start_module_sim: StartSim) -> SimProcess:
    return start_module_sim("--sim-seed", "3")


def generate(sim: SimProcess, **body: Any) -> Any:
    response = sim.generate(body)
    assert response.status_code == 200, response.text
    return response.json()


def test_no_logprob_fields_unless_asked(sim: SimProcess) -> None:
    meta = generate(sim, text=PROMPT, sampling_params={"max_new_tokens": 4})["meta_info"]
    assert not {k for k in meta if "logprob" in k}


def test_default_start_reports_the_last_prompt_token_and_every_output_token(
    sim: SimProcess,
) -> None:
    result = generate(
        sim, text=PROMPT, return_logprob=True,
        sampling_params={"max_new_tokens": 5, "temperature": 0},
    )  # fmt: skip
    meta = result["meta_info"]
    # logprob_start_len -1 = len(prompt) - 1: one input entry, whose logprob is None.
    assert len(meta["input_token_logprobs"]) == 1
    assert meta["input_token_logprobs"][0][0] is None
    output = meta["output_token_logprobs"]
    assert [token_id for _, token_id, _ in output] == result["output_ids"]
    assert all(text is None for _, _, text in output)  # no return_text_in_logprobs
    assert all(-5.0 < logprob < 0.0 for logprob, _, _ in output)
    assert "input_top_logprobs" not in meta
    assert "output_top_logprobs" not in meta


def test_start_zero_with_text_covers_the_whole_prompt(sim: SimProcess) -> None:
    meta = generate(
        sim, text=PROMPT, return_logprob=True, logprob_start_len=0,
        return_text_in_logprobs=True, sampling_params={"max_new_tokens": 3, "temperature": 0},
    )["meta_info"]  # fmt: skip
    entries = meta["input_token_logprobs"]
    assert [text for _, _, text in entries] == PIECES
    assert entries[0][0] is None
    assert all(isinstance(logprob, float) for logprob, _, _ in entries[1:])
    texts = "".join(text for _, _, text in meta["output_token_logprobs"])
    assert (
        texts
        == generate(sim, text=PROMPT, sampling_params={"max_new_tokens": 3, "temperature": 0})[
            "text"
        ]
    )


def test_top_logprobs_put_the_chosen_token_first(sim: SimProcess) -> None:
    meta = generate(
        sim, text=PROMPT, return_logprob=True, top_logprobs_num=3, logprob_start_len=6,
        sampling_params={"max_new_tokens": 4, "temperature": 0},
    )["meta_info"]  # fmt: skip
    assert meta["input_top_logprobs"][0] is None
    assert len(meta["input_top_logprobs"]) == len(PIECES) - 6
    output, top_lists = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert len(output) == len(top_lists) == 4
    for chosen, top in zip(output, top_lists, strict=True):
        assert len(top) == 3
        assert top[0] == chosen
        assert len({token_id for _, token_id, _ in top}) == 3
        assert [logprob for logprob, _, _ in top] == sorted(
            (logprob for logprob, _, _ in top), reverse=True
        )


def test_batch_prefill_only_scoring_as_sgl_select_sends_it(sim: SimProcess) -> None:
    # RuntimeEndpoint.select: one prompt per choice, no new tokens, logprobs from a start.
    results = generate(
        sim, text=[PROMPT + " Yes", PROMPT + " No"], return_logprob=True,
        return_text_in_logprobs=True, logprob_start_len=len(PIECES) - 2,
        sampling_params={"max_new_tokens": 0, "temperature": 0},
    )  # fmt: skip
    assert [r["meta_info"]["completion_tokens"] for r in results] == [0, 0]
    ends = [[text for _, _, text in r["meta_info"]["input_token_logprobs"]] for r in results]
    assert ends == [["France", "?", "Yes"], ["France", "?", "No"]]
    assert all(r["meta_info"]["output_token_logprobs"] == [] for r in results)


def test_prefill_only_default_start_reports_no_input_tokens(sim: SimProcess) -> None:
    meta = generate(sim, text=PROMPT, return_logprob=True, sampling_params={"max_new_tokens": 0})[
        "meta_info"
    ]
    assert meta["input_token_logprobs"] == []


def test_start_past_the_prompt_is_a_400(sim: SimProcess) -> None:
    response = sim.generate(
        {"text": PROMPT, "return_logprob": True, "logprob_start_len": len(PIECES),
         "sampling_params": {"max_new_tokens": 2}}
    )  # fmt: skip
    assert response.status_code == 400
    assert "is higher than the number of input tokens" in response.json()["error"]["message"]


def test_input_ids_prompt_without_text(sim: SimProcess) -> None:
    meta = generate(
        sim, input_ids=[1, 5000, 6000], return_logprob=True, logprob_start_len=0,
        return_text_in_logprobs=True, sampling_params={"max_new_tokens": 1},
    )["meta_info"]  # fmt: skip
    assert [entry[1:] for entry in meta["input_token_logprobs"]] == [
        [1, "<s>"], [5000, "<5000>"], [6000, "<6000>"],
    ]  # fmt: skip


def test_streamed_chunks_carry_cumulative_logprobs(start_sim: StartSim) -> None:
    # With speculation on, as the plugin's servers run.
    spec = start_sim(*EAGLE3_2STEP)
    with spec.client() as client, client.stream(
        "POST", "/generate",
        json={"text": PROMPT, "stream": True, "return_logprob": True,
              "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}},
    ) as response:  # fmt: skip
        events = stream_json(response)
    counts = [len(e["meta_info"]["output_token_logprobs"]) for e in events]
    assert counts == [e["meta_info"]["completion_tokens"] for e in events]
    assert counts[-1] == 12
    assert len(events) > 1
