import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # reference.py

import sieve  # noqa: E402  (PYTHONPATH=<build>/python, set by ctest)


@pytest.fixture(scope="session")
def runtime():
    """The build tree's plugins only (ctest sets SIEVE_TEST_PLUGIN_DIR), nothing from the environment."""
    plugin_dir = os.environ.get("SIEVE_TEST_PLUGIN_DIR")
    if plugin_dir:
        return sieve.Runtime(plugin_dirs=[plugin_dir], use_env=False, use_default_dirs=False)
    return sieve.Runtime()
