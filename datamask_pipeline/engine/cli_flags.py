"""What every command line of the project does the same way (``train_mask``/``datamask``,
``python -m datamask_pipeline.demo``, ``.jobs``, ``.register``):

* **its name**: the help and the errors name the command as it was invoked (``datamask``,
  ``train_mask``, ``python -m datamask_pipeline.demo``), not a fixed program name;
* **both spellings of every flag**: ``--select-ratio`` and ``--select_ratio`` (upstream's
  spelling) are the same flag, whichever one the parser declares; the help shows one;
* **one-line errors**: a bad flag or value exits 2 with one line naming the flag, the value and
  what is allowed (no usage block, no traceback);
* **values checked before any work**: the range types below, and :func:`learner_config`, which
  checks the method knobs one flag at a time so the error names the flag that broke the rule.

Cheap to import (argparse only; ``learner_config`` imports the engine's config when called).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys

__all__ = ["CommandLine", "invoked_prog", "spellings", "whole", "number", "learner_config"]


def invoked_prog(module: str, argv0: str | None = None) -> str:
    """The command's name as the user invoked it: the console script's name (``datamask``,
    ``train_mask``), or ``python -m MODULE`` when run as a module (argv[0] is then a path to
    a ``.py`` file) or from ``python -c``."""
    if argv0 is None:
        argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0 or "")
    if not name or name == "-c" or name.endswith((".py", ".pyc")):
        return f"python -m {module}"
    return name


def spellings(flag: str) -> list:
    """``--select-ratio`` -> ``["--select-ratio", "--select_ratio"]`` (the given one first);
    short flags and flags without ``-``/``_`` in the name have one spelling."""
    if not flag.startswith("--"):
        return [flag]
    body = flag[2:]
    out = [flag]
    for alt in ("--" + body.replace("_", "-"), "--" + body.replace("-", "_")):
        if alt not in out:
            out.append(alt)
    return out


class _OneSpellingFormatter(argparse.HelpFormatter):
    """The help lists each flag once, in the spelling the parser declared first."""

    def _format_action_invocation(self, action):
        if action.option_strings:
            seen, shown = set(), []
            for s in action.option_strings:
                key = s.replace("_", "-")
                if key not in seen:
                    seen.add(key)
                    shown.append(s)
            action = copy.copy(action)
            action.option_strings = shown
        return super()._format_action_invocation(action)


# argparse names a flag by all its option strings ("--select-ratio/--select_ratio")
_ONE_SPELLING = re.compile(r"(--[\w-]+)/(--[\w-]+)")


def _same(a: str, b: str) -> bool:
    return a.replace("_", "-") == b.replace("_", "-")


BOTH_SPELLINGS_NOTE = ("Every flag takes hyphens or underscores alike (--select-ratio = "
                       "--select_ratio).")


class CommandLine(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with the project's conventions (module docstring).

    ``module``: the dotted module the command runs as with ``python -m`` (its name when not
    invoked as a console script). Both spellings of every long flag are registered when the
    arguments are parsed (or the help is printed), so flags added to groups and mutually
    exclusive groups get them too."""

    def __init__(self, module: str, **kw):
        kw.setdefault("prog", invoked_prog(module))
        kw.setdefault("formatter_class", _OneSpellingFormatter)
        super().__init__(**kw)
        self._two_spellings = False

    def _add_spellings(self) -> None:
        # argparse keeps one table of option strings per parser, shared with its groups
        table = self._option_string_actions
        for action in self._actions:
            for flag in list(action.option_strings):
                for alt in spellings(flag)[1:]:
                    if alt not in table:
                        action.option_strings.append(alt)
                        table[alt] = action
                        self._two_spellings = True
        if self._two_spellings and BOTH_SPELLINGS_NOTE not in (self.epilog or ""):
            self.epilog = f"{self.epilog} {BOTH_SPELLINGS_NOTE}" if self.epilog else \
                BOTH_SPELLINGS_NOTE

    def parse_known_args(self, args=None, namespace=None):
        self._add_spellings()
        return super().parse_known_args(args, namespace)

    def format_help(self):
        self._add_spellings()
        return super().format_help()

    def error(self, message):
        """One line: what is wrong (argparse names the flag and, for a choice, what is
        allowed), and where the flags are listed. Exit code 2."""
        message = _ONE_SPELLING.sub(lambda m: m.group(1) if _same(m.group(1), m.group(2))
                                    else m.group(0), message)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def fail(self, message: str, code: int = 2):
        """A one-line error found after parsing (a value, a path, a conflict); exits."""
        self.exit(code, f"{self.prog}: error: {message}\n")


def whole(minimum: int):
    """An argparse ``type``: an integer >= ``minimum``."""

    def convert(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number (expected an integer >= {minimum})") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{text} is out of range (expected an integer "
                                             f">= {minimum})")
        return v

    convert.__name__ = f"integer >= {minimum}"
    return convert


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False):
    """An argparse ``type``: a finite number in the interval [low, high] (``low_open`` /
    ``high_open``: that end excluded; None: unbounded)."""
    import math

    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    interval = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"

    def convert(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number (expected a number in {interval})") from None
        bad = not math.isfinite(v)
        if low is not None:
            bad |= v <= low if low_open else v < low
        if high is not None:
            bad |= v >= high if high_open else v > high
        if bad:
            raise argparse.ArgumentTypeError(f"{text} is out of range (expected a number in "
                                             f"{interval})")
        return v

    convert.__name__ = f"number in {interval}"
    return convert


def learner_config(base: dict, given: dict, flag_of):
    """The method knobs ``given`` on a command line over ``base`` (a profile's or preset's
    values), as a ``LearnerConfig``. Each given knob is checked on its own first, so a broken
    rule raises ``ConfigError`` naming its flag and value: ``--select-ratio 1.5:
    select_ratio must be in (0, 1), got 1.5``. ``flag_of(knob)``: the flag as the user knows
    it."""
    from .config import ConfigError, LearnerConfig

    for knob, value in given.items():
        try:
            LearnerConfig(**{**base, knob: value})
        except ConfigError as exc:
            raise ConfigError(f"{flag_of(knob)} {_shown(value)}: {exc}") from None
    return LearnerConfig(**{**base, **given})


def _shown(value) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v:g}" for k, v in value.items())
    return str(value)
