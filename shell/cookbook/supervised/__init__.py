"""`tinker_cookbook.supervised`: the datum builders and metrics a supervised loop uses, over
`shell.sft` (`common`, `data`). The cookbook's supervised trainer, dataset builders and
evaluators (`train`, `types`, the rest of `data`, `nll_evaluator`) are not here: recipes that
import them do not port yet (`rlpure serve` runs them unported)."""
