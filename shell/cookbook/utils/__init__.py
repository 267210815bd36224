"""`tinker_cookbook.utils`: its modules, imported by name as cookbook code does
(`from shell.cookbook.utils import logtree`)."""

__all__: list[str] = []
