"""Benchmarks, one package per topic (see bench/README.md); shared helpers in bench/common.py."""
