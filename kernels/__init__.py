"""Pallas kernels, installed as `swajax.kernels` (one kernel per file, reference beside each)."""
