"""gpu-smoke launch check: the plugin starts the server (its own port choice), it answers."""

import httpx
import pytest


@pytest.mark.parametrize("specdecode_server", ["smoke-launch"], indirect=True)
def test_launch(specdecode_server):
    base = specdecode_server.base_url
    r = httpx.post(
        f"{base}/generate",
        json={"text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
        timeout=60,
    )
    r.raise_for_status()
    if httpx.get(f"{base}/server_info", timeout=30).json().get("simulated"):
        return  # the dry run's stand-in has its own vocabulary
    assert r.json()["text"] == " the" * 4  # tiny-llama's only greedy answer
