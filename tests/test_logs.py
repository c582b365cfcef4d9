"""Both commands' logs (common/logs.py): the text format says what the JSON one does."""

from __future__ import annotations

import json
import logging

import pytest

from numaguard.common import logs


@pytest.fixture
def restored():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_line_s_fields_are_in_either_format(log_format, capsys, restored):
    logs.setup(log_format)
    logging.getLogger("numaguard.test").info("listening", extra={"listen": "0.0.0.0:9847"})
    (line,) = capsys.readouterr().err.splitlines()
    if log_format == "json":
        assert json.loads(line)["listen"] == "0.0.0.0:9847"
    else:
        assert line.endswith("INFO numaguard.test listening listen=0.0.0.0:9847")
