"""`tinker_cookbook.preference`: its `types` and `preference_datasets` modules (`shell.comparisons`)."""

__all__: list[str] = []
