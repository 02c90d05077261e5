"""Tests of the simulated SGLang server (``python -m pytest_specdecode.sim``)."""
