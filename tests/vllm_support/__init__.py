"""Helpers for tests against a real vLLM server (the CPU wheel, in its own virtual environment)."""
