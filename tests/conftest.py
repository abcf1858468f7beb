import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import user_dir  # noqa: E402,F401  (registers the plugin's models, tasks and criteria)

SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")


@pytest.fixture(scope="session")
def shared_data():
    """Path to ``../shared/data``; tests that need it are skipped when it is absent."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"shared datasets not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def toy_translation_bin(tmp_path_factory):
    """A tiny binarized en→de corpus (synthetic generator + BPE + fairseq-preprocess)."""
    from tests.helpers.cli import make_toy_translation_data

    return make_toy_translation_data(tmp_path_factory.mktemp("toy_mt"))


@pytest.fixture(scope="session")
def toy_lm_bin(tmp_path_factory):
    """A tiny binarized monolingual corpus for language-model tasks."""
    from tests.helpers.cli import make_toy_lm_data

    return make_toy_lm_data(tmp_path_factory.mktemp("toy_lm"))
