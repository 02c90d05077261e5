"""The phases of scripts/gpu-smoke after installation (run through scripts/gpu_smoke/driver.py).

common: state layout, rig, knobs, the pytest runner; budget: what a unit costs; state: the
archive carried out and restored; phases: record, check, attach, launches, noise, probe;
summary: the noise summary of record and check; spread: the NCCL spread phases; suite: the
generated suite; table: the table; main: the order of a call.
"""
