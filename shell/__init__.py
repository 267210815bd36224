"""shell: the effect layer around `rlpure` (environments, rollouts, backends, logs, CLI)."""

__all__: list[str] = []
