"""`python -m shardscope.cli …` runs the command line."""

from shardscope.cli import main

main()
