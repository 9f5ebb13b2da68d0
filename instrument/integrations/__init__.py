"""Integrations with what launches and drives training: Ray (:mod:`.ray`, which imports Ray, so import it
explicitly) and the Nsight Systems launcher (:mod:`.nsys`, standard library only).
"""
