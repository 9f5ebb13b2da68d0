"""Backends that record traces (loaded lazily: importing instrument never imports them)."""
