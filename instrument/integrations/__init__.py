"""Integrations with distributed runtimes; each imports its runtime, so import it explicitly."""
