"""A fake ``sglang`` package for failure injection (see tests/fake_engines/README.md)."""
