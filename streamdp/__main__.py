"""``python -m streamdp``: the command line (:mod:`streamdp.cli`)."""

from streamdp.cli import main

main()
