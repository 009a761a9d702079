"""The package metadata: pyproject.toml reads without setuptools' deprecation warnings."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_reads_without_deprecation_warnings():
    pyprojecttoml = pytest.importorskip("setuptools.config.pyprojecttoml")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = pyprojecttoml.read_configuration(ROOT / "pyproject.toml")
    assert config["project"]["license"] == "Apache-2.0"  # an SPDX expression, not a table
    noisy = [str(w.message).splitlines()[0] for w in caught if "license" in str(w.message).lower()]
    assert noisy == []
