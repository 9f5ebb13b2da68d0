"""Test support for the NVTX backend: a logging NVTX tool (C), its build, and pytest fixtures."""
