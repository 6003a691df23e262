"""Commands of the `shardscope` command line beyond the planning core, each module registering its own on
the one typer app (`shardscope.cli.app`)."""
