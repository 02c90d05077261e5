#!/usr/bin/env python3
"""The phases of scripts/gpu-smoke after installation: record, check, attach, the noise summary,
the table; the noise batches, launches and spread phases on request.

    python3 scripts/gpu_smoke/driver.py [PHASE ...]  # default: record check attach
                                                     #   noise-summary table
    python3 scripts/gpu_smoke/driver.py table DIR ...  # merge results folders (no GPU)

Run by scripts/gpu-smoke (which installs the wheels and the plugin and builds the models first).
The code is the package beside this file, scripts/gpu_smoke/smoke/ (common, budget, state,
phases, summary, spread, suite, table, main); docs/gpu-smoke.md has the knobs.
"""

from __future__ import annotations

import sys

from smoke.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
