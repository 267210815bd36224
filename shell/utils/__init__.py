"""shell.utils: tinker-cookbook 0.6.1's `utils` modules that RL env and recipe code imports.

Submodules (imported by name, as cookbook code does: `from shell.utils import logtree`):
- `shell.utils.logtree`: scope-structured logs built inside `init_trace`, written as a
  self-contained HTML page and JSON; no-ops outside a trace.
- `shell.utils.logtree_formatters`: `ConversationFormatter` for `logtree.log_formatter`.
- `shell.utils.misc_utils`: `safezip`, `split_list`, `all_same`, `dict_mean`, `timed`,
  `iteration_dir`, ... with the cookbook's semantics.
"""

__all__: list[str] = []
