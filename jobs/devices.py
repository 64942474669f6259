"""The one device rule of every command: `--device auto | cpu | cuda | cuda:N`, resolved by
`engine.embedder.resolve_device` (auto = cuda when available, else cpu)."""

from __future__ import annotations

import argparse

DEVICE_HELP = "auto | cpu | cuda | cuda:N for the model and the kernels (auto: cuda when available, else cpu)"


def add_device_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: str | None = "auto",
                        unset: str | None = None) -> None:
    """Adds --device; `unset` describes what default=None means for that command."""
    parser.add_argument("--device", default=default, metavar="DEV",
                        help=f"{DEVICE_HELP}; default {unset or default}")
