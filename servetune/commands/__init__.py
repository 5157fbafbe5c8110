"""CLI command modules, one per command group; wired in servetune/cli.py."""
