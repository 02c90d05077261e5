"""Tests against a real llama.cpp ``llama-server`` with generated tiny models."""
