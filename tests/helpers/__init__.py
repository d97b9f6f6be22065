"""Helpers shared by the test files (no tests here): tiny models, offline hub caches, SLURM, resume runs.

Test files import them as ``from helpers import hubcache`` (pytest puts tests/ on ``sys.path``); no
test file imports another test file. Fixtures shared across files live in tests/conftest.py.
"""
