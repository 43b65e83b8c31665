"""The command line's small habits: help on every option, levels of logging, progress bars
only where a person watches."""

import argparse
import io
import sys

from swajax import progress_bar
from swajax.cli.main import build_parser


def _options(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*prefix, name))
        elif not isinstance(action, argparse._HelpAction):
            yield " ".join(prefix), action


def test_every_option_has_help_and_shows_its_default():
    undocumented = [(cmd, a.dest) for cmd, a in _options(build_parser()) if not a.help]
    assert not undocumented
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices["generate"].format_help().split())
    assert "a hub id in the local Hugging Face cache (default: tiny)" in text


def test_logging_levels(cli):
    argv = ("generate", "--prompt-ids", "1,2", "--max-tokens", "1")
    _, _, quiet = cli("-q", *argv)
    _, _, default = cli(*argv)
    _, _, verbose = cli("-v", *argv)
    assert quiet == default == ""
    assert "swajax: INFO: loading" in verbose and "swajax: INFO: pools:" in verbose


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bars_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress_bar.progress(3, "loading") as advance:
        advance()
    assert sys.stderr.getvalue() == ""  # captured, not a terminal: nothing drawn
    monkeypatch.setattr(sys, "stderr", _Terminal())
    with progress_bar.progress(3, "loading", shown=False) as advance:
        advance()
    assert sys.stderr.getvalue() == ""
    with progress_bar.progress(3, "loading") as advance:
        for _ in range(3):
            advance()
    assert "loading" in sys.stderr.getvalue()
