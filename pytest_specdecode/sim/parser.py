"""Building the simulated server's command line: SGLang ``release``'s ``launch_server`` flags
(read from :mod:`pytest_specdecode.sglang_releases`) plus the ``--sim-*`` knobs, in named groups,
with the small argparse types they use.

Apart from ``args.py`` because declaring the flags (what ``--help`` shows, what argparse accepts)
is one job and resolving them as SGLang does is another; ``args.py`` imports this module, never
the other way round. The names of the environment's test knobs live here because the parser's
epilog names them; ``args.py`` applies them and re-exports the names.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from pytest_specdecode import sglang_releases
from pytest_specdecode.sim import noise, versions

FAULT_KINDS = (
    "exit-during-load",
    "crash-after:N",
    "hang",
    "hang-after:N",
    "http-500",
    "malformed-sse",
    "flap-health",
)


#: Test knobs read from the environment, deliberately outside every profile and fingerprint.
#: A real regression (a slower SGLang build, a broken draft model) changes speed without
#: changing the configuration; setting these for the server's process does the same to the
#: simulated server, so a baseline recorded without them is still compared, and must catch it.
#: ``SPECDECODE_SIM_SLOWDOWN`` and ``SPECDECODE_SIM_ACCEPT_SCALE`` multiply ``--sim-slowdown``
#: and ``--sim-accept-scale`` (an injected change on top of what the command line configures);
#: ``SPECDECODE_SIM_NOISE_CV`` replaces ``--sim-noise-cv``. They apply to servers started with
#: them (a kept-alive server keeps the values it was started with), and the effective values
#: are logged at startup and reported by ``/server_info``.
ENV_SLOWDOWN = "SPECDECODE_SIM_SLOWDOWN"
ENV_ACCEPT_SCALE = "SPECDECODE_SIM_ACCEPT_SCALE"
ENV_NOISE_CV = "SPECDECODE_SIM_NOISE_CV"
#: ``SPECDECODE_SIM_LAUNCH_CV`` replaces ``--sim-launch-cv`` (launch-to-launch variance).
ENV_LAUNCH_CV = "SPECDECODE_SIM_LAUNCH_CV"
ENV_KNOBS = (ENV_SLOWDOWN, ENV_ACCEPT_SCALE, ENV_NOISE_CV, ENV_LAUNCH_CV)
#: ``SPECDECODE_SIM_LAUNCH_SCRIPT`` (sim/launch_script.py) adds flags per launch, for tests.


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _fault(text: str) -> str:
    if text in FAULT_KINDS or re.fullmatch(r"(crash|hang)-after:\d+", text):
        return text
    raise argparse.ArgumentTypeError(
        f"unknown fault {text!r}; choose one of {', '.join(FAULT_KINDS)} "
        "(N = requests served before the crash or hang)"
    )


def _typed(type_name: str | None) -> Callable[[str], Any]:
    return {"int": int, "float": float}.get(type_name or "str", str)


def _add_sglang_flag(group: argparse._ArgumentGroup, flag: sglang_releases.FlagSpec) -> None:
    """Declare one SGLang option as its release did (arity, type, choices), default unset."""
    kwargs: dict[str, Any] = {"dest": flag.dest, "default": argparse.SUPPRESS}
    opts = list(flag.opts)
    kind, nargs = flag.kind, flag.nargs
    if kind in ("store_true", "store_false", "store_const", "count"):
        kwargs["action"] = kind if kind != "store_const" else "store_const"
        if kind == "store_const":
            kwargs["const"] = True
    elif kind == "boolean_optional":
        kwargs["action"] = argparse.BooleanOptionalAction
        opts = [o for o in opts if not o.startswith("--no-")] or opts
    elif kind == "custom" and nargs == "0":
        kwargs.update(action="store_const", const=True)
    else:
        if kind == "append":
            kwargs["action"] = "append"
        if nargs not in (None, "1") or (kind == "append" and nargs is not None):
            kwargs["nargs"] = int(nargs) if nargs and nargs.isdigit() else nargs
        convert = _typed(flag.type)
        kwargs["type"] = convert
        if flag.choices:
            try:
                kwargs["choices"] = [convert(c) for c in flag.choices]
            except ValueError:
                kwargs["choices"] = list(flag.choices)
    if flag.dest == "model_path":
        kwargs["required"] = True
    group.add_argument(*opts, **kwargs)


def build_parser(release: str | None = None) -> argparse.ArgumentParser:
    """The command line of SGLang ``release`` (default: the newest supported) plus ``--sim-*``."""
    release = release or sglang_releases.newest()
    parser = _new_parser(release)
    _add_sglang_args(parser, release)
    sim = parser.add_argument_group("simulation knobs (pytest-specdecode only)")
    # In this order in --help: timing, noise and seed, fault, release, launch variance.
    _add_timing_knobs(sim)
    _add_noise_knobs(sim)
    _add_fault_knob(sim)
    _add_release_knob(sim)
    _add_launch_knobs(sim)
    return parser


def _new_parser(release: str) -> argparse.ArgumentParser:
    """The parser itself: SGLang's program name for ``release``, the simulator's description and
    the epilog naming the environment's test knobs."""
    era = versions.era(release)
    return argparse.ArgumentParser(
        prog=era.prog,
        description=(
            "A simulated SGLang server (no GPU): SGLang's HTTP API, load phases and log lines, "
            "with token timing from a small performance model fitted to measured figures. "
            f"Every figure it produces is simulated. This parser speaks SGLang {release} "
            f"(--sim-sglang-version; supported {sglang_releases.supported_range()})."
        ),
        epilog=(
            "Flags that SGLang release does not accept are rejected, as SGLang rejects them. "
            f"Test knobs from the environment, outside any profile or fingerprint: {ENV_SLOWDOWN} "
            f"and {ENV_ACCEPT_SCALE} multiply --sim-slowdown and --sim-accept-scale, "
            f"{ENV_NOISE_CV} replaces --sim-noise-cv (inject a regression of the same "
            f"configuration), {ENV_LAUNCH_CV} replaces --sim-launch-cv; "
            f"{versions.ENV_SGLANG_VERSION} is the default of --sim-sglang-version."
        ),
    )


def _add_sglang_args(parser: argparse.ArgumentParser, release: str) -> None:
    """Every flag ``release``'s ``launch_server`` declares, in one group."""
    sglang = parser.add_argument_group(
        f"SGLang server arguments (as python -m sglang.launch_server of SGLang {release})"
    )
    for flag in sglang_releases.flags(release):
        _add_sglang_flag(sglang, flag)


def _add_timing_knobs(sim: argparse._ArgumentGroup) -> None:
    """How long loading takes, how fast the model runs, and an injected regression of both."""
    sim.add_argument(
        "--sim-load-seconds",
        type=non_negative_float,
        default=5.0,
        help="total time of the load phases, port closed (default 5; divided by --sim-speed)",
    )
    sim.add_argument(
        "--sim-speed",
        type=positive_float,
        default=1.0,
        help="run F times faster than the model: all rates x F, all durations / F (CI speed-up)",
    )
    sim.add_argument(
        "--sim-slowdown",
        type=positive_float,
        default=1.0,
        help="inject a regression: prefill/decode/verify rates divided by F",
    )
    sim.add_argument(
        "--sim-accept-scale",
        type=non_negative_float,
        default=1.0,
        help="multiply draft acceptance probabilities by F (capped at 1)",
    )


def _add_noise_knobs(sim: argparse._ArgumentGroup) -> None:
    """Run-to-run noise (a CV or a measured preset) and the seed of all simulated randomness."""
    sim.add_argument(
        "--sim-noise-cv",
        type=non_negative_float,
        default=None,
        help=(
            "run-to-run noise: CV of each request's lognormal speed factor (default: the noise "
            f"preset's, else {noise.DEFAULT_RUN_CV:g})"
        ),
    )
    sim.add_argument(
        "--sim-noise-preset",
        choices=[*noise.preset_names(), noise.AUTO_PRESET, noise.NO_PRESET],
        default=None,
        metavar="NAME",
        help=(
            "run and launch noise measured on real hardware ([noise.*] of the sim's model.toml): "
            f"{', '.join(noise.preset_names())}; {noise.AUTO_PRESET}: at tp "
            f"{noise.load_presets().auto_tp_size} with CUDA graphs on, the one nearest in "
            f"speculative steps (else none); {noise.NO_PRESET} (the default). A --sim-noise-cv "
            "or --sim-launch-cv given wins over the preset for its knob"
        ),
    )
    sim.add_argument(
        "--sim-seed",
        type=int,
        default=None,
        help="seed of all simulated randomness (default: --random-seed, else random)",
    )


def _add_fault_knob(sim: argparse._ArgumentGroup) -> None:
    """The injected fault (``FAULT_KINDS``)."""
    sim.add_argument(
        "--sim-fault",
        type=_fault,
        default=None,
        metavar="KIND",
        help=(
            "inject a fault: exit-during-load, crash-after:N (die while serving request N+1), "
            "hang (freeze once ready), hang-after:N (freeze, alive, while serving request N+1), "
            "http-500, malformed-sse, flap-health; all but exit-during-load start after the "
            "warm-up"
        ),
    )


def _add_release_knob(sim: argparse._ArgumentGroup) -> None:
    """The SGLang release spoken (read before parsing too: ``requested_release``)."""
    sim.add_argument(
        "--sim-sglang-version",
        default=None,
        metavar="VERSION",
        help=(
            "the SGLang release to behave like: flags, argument resolution, /server_info, "
            f"meta_info, log lines (supported {sglang_releases.supported_range()}; default "
            f"${versions.ENV_SGLANG_VERSION}, else {sglang_releases.newest()})"
        ),
    )


def _add_launch_knobs(sim: argparse._ArgumentGroup) -> None:
    """Launch-to-launch variance: the CV of a launch's speed factor and the seed drawing it."""
    sim.add_argument(
        "--sim-launch-cv",
        type=non_negative_float,
        default=None,
        help=(
            "launch-to-launch variance: CV of a lognormal speed factor drawn once at start-up "
            "(default: the noise preset's, else 0: every launch equally fast)"
        ),
    )
    sim.add_argument(
        "--sim-launch-seed",
        type=int,
        default=None,
        help=(
            "seed of the launch factor together with the sim seed (default: a fresh random "
            "one per launch, reported in /server_info as sim_launch_seed)"
        ),
    )
