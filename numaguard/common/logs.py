"""Logging set-up shared by both commands: one JSON object per line, or plain text."""

from __future__ import annotations

import argparse
import logging
import sys

from pythonjsonlogger.json import JsonFormatter

# what every LogRecord has: the rest are a line's own fields (``extra=``)
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}


class TextWithFields(logging.Formatter):
    """Plain text, with the fields the JSON lines carry (a listen address, a reason)
    after the message as key=value, so that neither format says less."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        return " ".join([line, *(f"{k}={v}" for k, v in fields.items())])


def setup(log_format: str = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(
            JsonFormatter(
                "%(levelname)s %(name)s %(message)s",
                rename_fields={"levelname": "level", "name": "logger"},
                timestamp="time",
            )
        )
    else:
        handler.setFormatter(TextWithFields("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The Kubernetes client logs every request at INFO; keep our log about us.
    logging.getLogger("kubernetes").setLevel(logging.WARNING)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--log-format and --log-level, as every numaguard command takes them."""
    parser.add_argument(
        "--log-format",
        choices=("json", "text"),
        default="json",
        help="json: one object per line on stderr, for log pipelines; text: for people",
    )
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info", help=" "
    )
