"""``python -m streamdp``: the command line (:mod:`streamdp.cli`)."""

from streamdp.cli import run

run()
