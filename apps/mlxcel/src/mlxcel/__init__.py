"""The mlxcel command line: `mlxcel generate | bench` and the `mlxcel-server` entry point."""
