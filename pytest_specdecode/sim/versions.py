"""Which SGLang release the simulator speaks (``--sim-sglang-version``), and what that changes.

Two kinds of per-version knowledge shape the simulator; the second lives here:

- **Exact per release**, not here but in :mod:`pytest_specdecode.sglang_releases` (the package's
  data about SGLang itself, which the core reads too; generated from the released wheels by
  ``scripts/gen-sim-flags.py``): the ``launch_server`` flags (names, arities, types, choices) and
  the ``ServerArgs`` fields ``/server_info`` echoes. The parser of a requested release accepts
  what that release accepts and nothing else (argparse's "unrecognized arguments", exit 2).
- **Behaviour eras**, boundaries read in the sources (``srt/server_args.py``,
  ``srt/arg_groups/speculative_hook.py``, ``srt/managers/tokenizer_manager.py``,
  ``srt/entrypoints/http_server.py``, the CUDA-graph runners) and checked against the real 0.5.15
  run in ``tests/contract/data``:

  ======================  ====================================================================
  boundary                what changes
  ======================  ====================================================================
  0.5.7                   ``spec_*`` meta_info only after a verify step (0.5.6: always, zeros)
  0.5.9                   ``spec_accept_histogram``; ``cached_tokens_details``
  0.5.10                  ``reasoning_tokens``/``dp_rank``; timing fields of the 0.5.15 shape
  0.5.11                  spec v2 (overlap on) by default for EAGLE/EAGLE3/STANDALONE unless
                          topk > 1; ``spec_accepted_drafts``/``spec_proposed_drafts``; derived
                          gRPC port ``port + 10000`` must be <= 65535; prog ``sglang serve``
  0.5.12                  ``spec_num_correct_drafts``/``spec_num_proposed_drafts`` (old names
                          kept as aliases), ``spec_correct_drafts_histogram``;
                          ``num_retractions`` replaces ``total_retractions``
  0.5.13                  spec v2 always (overlap stays as the user set it; topk > 1 too);
                          NGRAM no longer forces overlap off
  0.5.14                  CUDA-graph capture logged per graph ("Capture target prefill CUDA
                          graph begin. ..."), KV-cache line with dtype, one pool per model
  0.5.16                  gRPC port only when set (``--grpc-port``): high main ports work again
  0.5.19                  OpenAI-compatible routes return ``sglext.spec_tokens_details`` when
                          the request sets ``return_spec_tokens_details`` (0.5.18 and older:
                          no speculative details there at all)
  0.5.21                  the ``spec_accepted_drafts``/``spec_proposed_drafts`` and
                          ``spec_accept_histogram`` aliases are gone
  0.5.23                  ``/get_load`` is gone
  ======================  ====================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_specdecode.sglang_releases import field_defaults

ENV_SGLANG_VERSION = "SPECDECODE_SIM_SGLANG_VERSION"


def _patch(release: str) -> int:
    return int(release.rsplit(".", 1)[1])


@dataclass(frozen=True)
class Era:
    """The behaviours of one release that the simulator models (see the module docstring)."""

    release: str
    patch: int

    @property
    def prog(self) -> str:
        return "sglang serve" if self.patch >= 11 else "launch_server.py"

    @property
    def spec_meta_always(self) -> bool:
        return self.patch <= 6

    @property
    def spec_names(self) -> str:
        """``token_num`` (<= 0.5.10), ``drafts`` (0.5.11), ``correct`` (0.5.12-0.5.20),
        ``correct_only`` (0.5.21+)."""
        if self.patch <= 10:
            return "token_num"
        if self.patch == 11:
            return "drafts"
        return "correct" if self.patch <= 20 else "correct_only"

    @property
    def accept_histogram(self) -> bool:
        return self.patch >= 9

    @property
    def cached_tokens_details(self) -> bool:
        return self.patch >= 9

    @property
    def modern_meta(self) -> bool:
        """reasoning_tokens, dp_rank and the 0.5.15 timing fields (0.5.10+)."""
        return self.patch >= 10

    @property
    def retractions_key(self) -> str:
        return "num_retractions" if self.patch >= 12 else "total_retractions"

    @property
    def spec_v2_default(self) -> bool:
        """EAGLE family keeps the overlap scheduler on unless told otherwise (0.5.11+)."""
        return self.patch >= 11

    @property
    def spec_v2_only(self) -> bool:
        """No spec v1 any more: topk > 1 no longer turns overlap off (0.5.13+)."""
        return self.patch >= 13

    @property
    def ngram_disables_overlap(self) -> bool:
        return self.patch <= 12

    @property
    def derived_grpc_port(self) -> bool:
        """``grpc_port = port + 10000`` always computed and range-checked (0.5.11-0.5.15)."""
        return 11 <= self.patch <= 15

    @property
    def grpc_port_flag(self) -> bool:
        return self.patch >= 16

    @property
    def graph_capture_per_graph(self) -> bool:
        """ "Capture target prefill CUDA graph begin. ..." style (0.5.14+)."""
        return self.patch >= 14

    @property
    def openai_spec_details(self) -> bool:
        """``return_spec_tokens_details`` on /v1/completions and /v1/chat/completions (0.5.19+)."""
        return self.patch >= 19

    @property
    def get_load_route(self) -> bool:
        return self.patch <= 22

    @property
    def weight_version_gone(self) -> bool:
        """``/weight_version`` answers a 404 pointing at ``/model_info`` (0.5.9+)."""
        return self.patch >= 9

    @property
    def cuda_graph_config(self) -> bool:
        return "cuda_graph_config" in field_defaults(self.release)


def era(release: str) -> Era:
    return Era(release=release, patch=_patch(release))
