"""Run and launch noise of the simulated server: hand-set (``--sim-noise-cv``,
``--sim-launch-cv``) or a named preset measured on real hardware (``[noise.*]`` in
``model.toml``, ``--sim-noise-preset NAME``).

``--sim-noise-preset auto`` gives a server at tp 1 with CUDA graphs on the preset measured on
one H200 at TP 1 whose speculative steps are nearest its own, because that is the box such a
profile stands for (other servers keep the fixed defaults). It is not the default: a simulated
server whose launches vary gets its baselines recorded over 3 launches and its verdicts judged
with the stated launch prior, so making it the default would have changed every existing
simulated tp-1 suite and its committed baselines at once. Without a preset the noise is the
fixed default (run CV 3 %, launches alike) or what ``--sim-noise-cv`` / ``--sim-launch-cv`` set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pytest_specdecode.sim.model import MODEL_CONSTANTS_PATH, read_model_file

#: The noise of a server without a preset: run CV 3 % per request, every launch alike.
DEFAULT_RUN_CV = 0.03
DEFAULT_LAUNCH_CV = 0.0
#: ``--sim-noise-preset none``: no preset (the default).
NO_PRESET = "none"
#: ``--sim-noise-preset auto``: the measured preset for a server of the rig's kind, else none.
AUTO_PRESET = "auto"


@dataclass(frozen=True)
class NoisePreset:
    """One measured noise level (a ``[noise.NAME]`` table of ``model.toml``)."""

    name: str
    run_cv: float
    launch_cv: float
    steps: int
    """The speculative steps of the measured profile (0: no speculation)."""
    profile: str
    """The measured profile's name in the contract file the label names."""
    label: str
    """Where the figures come from, e.g. "measured on one H200, TP 1 (...)"."""


@dataclass(frozen=True)
class NoisePresets:
    presets: dict[str, NoisePreset]
    auto_tp_size: int


@cache
def load_presets(path: Path = MODEL_CONSTANTS_PATH) -> NoisePresets:
    """The ``[noise]`` section of the model constants file."""
    section: Mapping[str, Any] = read_model_file(path)["noise"]
    presets = {
        name: NoisePreset(
            name=name,
            run_cv=float(table["run_cv"]),
            launch_cv=float(table["launch_cv"]),
            steps=int(table["steps"]),
            profile=str(table["profile"]),
            label=str(section["label"]),
        )
        for name, table in section.items()
        if isinstance(table, dict)
    }
    return NoisePresets(presets=presets, auto_tp_size=int(section["auto_tp_size"]))


def preset_names() -> list[str]:
    return sorted(load_presets().presets)


@dataclass(frozen=True)
class Noise:
    run_cv: float
    launch_cv: float
    preset: NoisePreset | None
    chosen_by: str
    """Why the preset applies ("--sim-noise-preset", "tp 1 with CUDA graphs on"), or ""."""

    def describe(self) -> str:
        """One line for the log: the figures and where they come from."""
        figures = f"run CV {self.run_cv:g}, launch CV {self.launch_cv:g}"
        if self.preset is None:
            return f"noise: {figures} (set by hand or the fixed defaults)"
        return (
            f"noise: {self.preset.label}: {figures} (preset {self.preset.name}, the measured "
            f"profile {self.preset.profile}; chosen by {self.chosen_by})"
        )


def resolve_noise(
    preset_name: str | None,
    run_cv: float | None,
    launch_cv: float | None,
    *,
    tp_size: int,
    cuda_graph: bool,
    speculative_steps: int,
) -> Noise:
    """The run and launch noise of a server. A flag given always wins for its knob; a named
    preset fills in the other; without a name, the automatic preset applies only when neither
    flag is given (noise set by hand is set as a whole). ``preset_name`` was checked by the
    parser (a known name, :data:`AUTO_PRESET` or :data:`NO_PRESET`; None means none)."""
    presets = load_presets()
    # the box such a server stands for is the one the presets were measured on
    automatic = tp_size == presets.auto_tp_size and cuda_graph and bool(presets.presets)
    preset, chosen_by = None, ""
    if preset_name is not None and preset_name not in (NO_PRESET, AUTO_PRESET):
        preset, chosen_by = presets.presets[preset_name], "--sim-noise-preset"
    elif preset_name == AUTO_PRESET and run_cv is None and launch_cv is None and automatic:
        preset = min(
            presets.presets.values(), key=lambda p: (abs(p.steps - speculative_steps), p.steps)
        )
        chosen_by = f"--sim-noise-preset auto at tp {tp_size} with CUDA graphs on"
    if preset is not None and run_cv is not None and launch_cv is not None:
        preset, chosen_by = None, ""  # both knobs set by hand: nothing of the preset is used
    fills = (preset.run_cv, preset.launch_cv) if preset else (DEFAULT_RUN_CV, DEFAULT_LAUNCH_CV)
    return Noise(
        run_cv=fills[0] if run_cv is None else run_cv,
        launch_cv=fills[1] if launch_cv is None else launch_cv,
        preset=preset,
        chosen_by=chosen_by,
    )
