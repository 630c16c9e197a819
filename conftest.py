"""Root conftest: doctests get a private temporary directory.

The library's doctests call ``tempfile.mkdtemp()`` as a user would; here that
directory lives under pytest's ``tmp_path`` (cleaned up by pytest), so a test run
leaves nothing behind in ``$TMPDIR``.
"""

from __future__ import annotations

import tempfile

import pytest


@pytest.fixture(autouse=True)
def _doctest_tempdir(request, monkeypatch):
    if isinstance(request.node, pytest.DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))
