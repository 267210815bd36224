"""shell.preference: tinker-cookbook 0.6.1's `preference` modules that RL env code imports.

Submodules (imported by name, as cookbook code does):
- `shell.preference.types`: `Comparison`, `LabeledComparison`, `PreferenceModel`,
  `PreferenceModelBuilder`, `PreferenceModelFromChatRenderer` (a judge sampled for one token),
  `PreferenceModelBuilderFromChatRenderer`, the comparison renderers; torch-free.
- `shell.preference.preference_datasets`: `ComparisonDatasetBuilder`,
  `ComparisonBuilderFromJsonl`.
"""

__all__: list[str] = []
