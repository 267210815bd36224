"""Task maths: problems, prompts and answer grading for the recipes' tasks (pure, no IO).

- `rlpure.tasks.arithmetic`: the demo's `a + b` problems, their strict grader and the
  base-model corpus (careful and hasty answer styles).
- `rlpure.tasks.math_grading`: GSM8K's `\\boxed{}` answer extraction, numeric normalisation and
  grading, and Tinker tutorial 104's question suffix and few-shot prefix.

Import the task module you need (`from rlpure.tasks import arithmetic`); the RL core
(`import rlpure`) does not import them.
"""
