"""What ``prioqueue jobs`` and ``prioqueue worker`` share on the command line (private)."""

from __future__ import annotations

import argparse
import os

__all__ = ["add_broker_options"]


def add_broker_options(parser: argparse.ArgumentParser, *, role: str, several: bool) -> None:
    """Add ``--broker`` and ``--key`` (their defaults from the environment).

    ``--broker`` defaults to ``PRIOQUEUE_BROKER_URL``, ``--key`` to ``PRIOQUEUE_KEY``.

    Args:
        parser: The subcommand's parser.
        role: The key's role, for its help (``submitter``, ``worker``).
        several: Whether several URLs (replicas) may be given, separated by commas.
    """
    env = os.environ
    several_help = ", several separated by commas" if several else ""
    parser.add_argument(
        "--broker",
        default=env.get("PRIOQUEUE_BROKER_URL"),
        metavar="URL",
        help=f"the broker's URL{several_help} (env PRIOQUEUE_BROKER_URL)",
    )
    parser.add_argument(
        "--key", default=env.get("PRIOQUEUE_KEY"), help=f"a {role} API key (env PRIOQUEUE_KEY)"
    )
