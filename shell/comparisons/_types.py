"""tinker-cookbook 0.6.1's `preference.types`: comparisons and preference models, without torch.

A `Comparison` is one prompt with two candidate completions (A, B); a `PreferenceModel` scores
it in [-1, 1] (-1: A preferred, 0: tie, 1: B preferred); `PreferenceModelFromChatRenderer`
does so by asking a sampling client for one greedy token (`A`, `B` or `Tie`) after the
comparison rendered as a chat. Names, fields and constructor signatures are the cookbook's, so
`rl/preference_envs.py` and its recipes port by the import rewrite alone.

Deliberate difference: the cookbook's module imports torch and
`ComparisonRenderer.to_model_input_weights` returns a `torch.Tensor` of weights; here the
weights are a float32 numpy array `[T]` (torch is not a dependency). Chat renderers may be
`shell.chat`' or the cookbook's own (anything with `build_generation_prompt`,
`build_supervised_example` and `tokenizer`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import chz
import numpy as np
import tinker
from tinker import types

from shell.chat import Message, get_renderer
from shell.clients import SamplingClient
from shell.tokenizers import get_tokenizer

__all__ = [
    "ChatRenderer",
    "Comparison",
    "ComparisonRenderer",
    "ComparisonRendererFromChatRenderer",
    "LabeledComparison",
    "PreferenceModel",
    "PreferenceModelBuilder",
    "PreferenceModelBuilderFromChatRenderer",
    "PreferenceModelFromChatRenderer",
]

logger = logging.getLogger(__name__)

_SWAPPED_LABEL: dict[str, Literal["A", "B", "Tie"]] = {"A": "B", "B": "A", "Tie": "Tie"}


class ChatRenderer(Protocol):
    """What the comparison renderer uses of a chat renderer (`shell.chat.Renderer` or the
    cookbook's)."""

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the renderer encodes with."""
        ...

    def build_generation_prompt(self, messages: list[Message]) -> Any:
        """The prompt for the next assistant message (a `tinker.ModelInput`)."""
        ...

    def build_supervised_example(self, messages: list[Message]) -> tuple[Any, Any]:
        """`(model_input, weights_T)` for the conversation."""
        ...


@dataclass
class Comparison:
    """Two completions (A and B) of the same prompt conversation.

    Attributes:
        prompt_conversation: the messages before either completion.
        completion_A: the first candidate's messages.
        completion_B: the second candidate's messages.
    """

    prompt_conversation: list[Message]
    completion_A: list[Message]
    completion_B: list[Message]

    def swap(self) -> Comparison:
        """The same comparison with A and B exchanged."""
        return Comparison(
            prompt_conversation=self.prompt_conversation,
            completion_A=self.completion_B,
            completion_B=self.completion_A,
        )


@dataclass
class LabeledComparison:
    """A `Comparison` with the preferred completion: `"A"`, `"B"` or `"Tie"`."""

    comparison: Comparison
    label: Literal["A", "B", "Tie"]

    def swap(self) -> LabeledComparison:
        """A and B exchanged and the label flipped to match (`Tie` stays `Tie`).

        Raises:
            KeyError: the label is not `"A"`, `"B"` or `"Tie"` (the cookbook's error type).
        """
        return LabeledComparison(
            comparison=self.comparison.swap(), label=_SWAPPED_LABEL[self.label]
        )


class ComparisonRenderer:
    """Renders comparisons for preference models: a prompt to sample a label from, and a
    labelled example to train on. Subclasses implement all three members."""

    def build_generation_prompt(self, comparison: Comparison) -> types.ModelInput:
        """The prompt after which a preference model writes its label."""
        raise NotImplementedError

    def to_model_input_weights(
        self, labeled_comparison: LabeledComparison
    ) -> tuple[types.ModelInput, np.ndarray]:
        """`(model_input, weights_T)` for training on the label; weights float32 `[T]`."""
        raise NotImplementedError

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of the rendered tokens."""
        raise NotImplementedError


class ComparisonRendererFromChatRenderer(ComparisonRenderer):
    """Renders a comparison as one chat: the prompt, then each completion after a system marker.

    The conversation is `prompt_conversation`, `==== Completion A ====`, completion A,
    `==== Completion B ====`, completion B, `==== Preference ====` (each marker a system
    message), followed by the label as an assistant message when training.

    Args:
        convo_renderer: the chat renderer that tokenizes the conversation.
    """

    def __init__(self, convo_renderer: ChatRenderer):
        self.convo_renderer = convo_renderer

    def _comparison_to_convo(self, comparison: Comparison) -> list[Message]:
        return [
            *comparison.prompt_conversation,
            {"role": "system", "content": "==== Completion A ===="},
            *comparison.completion_A,
            {"role": "system", "content": "==== Completion B ===="},
            *comparison.completion_B,
            {"role": "system", "content": "==== Preference ===="},
        ]

    def build_generation_prompt(self, comparison: Comparison) -> types.ModelInput:
        """The rendered comparison, ending where the assistant writes its preference."""
        prompt: types.ModelInput = self.convo_renderer.build_generation_prompt(
            self._comparison_to_convo(comparison)
        )
        return prompt

    def to_model_input_weights(
        self, labeled_comparison: LabeledComparison
    ) -> tuple[types.ModelInput, np.ndarray]:
        """The comparison with its label as the assistant's answer, cut after the first token of
        weight 1 (the model learns the label's first token); weights float32 `[T]`.

        Raises:
            ValueError: the rendered conversation holds non-text chunks (images).
        """
        convo = self._comparison_to_convo(labeled_comparison.comparison)
        convo.append({"role": "assistant", "content": labeled_comparison.label})
        model_input, weights = self.convo_renderer.build_supervised_example(convo)
        chunks = getattr(model_input, "chunks", ())
        if not all(isinstance(chunk, types.EncodedTextChunk) for chunk in chunks):
            raise ValueError(
                "ComparisonRendererFromChatRenderer: preference learning supports text-only "
                "content; the rendered comparison has non-text chunks"
            )
        weights_T = np.asarray(weights, dtype=np.float32)
        ones = np.flatnonzero(weights_T == 1.0)
        if ones.size == 0:
            return model_input, weights_T
        end = int(ones[0]) + 1
        tokens = list(model_input.to_ints())
        return types.ModelInput.from_ints(tokens[:end]), weights_T[:end]

    @property
    def tokenizer(self) -> Any:
        """The chat renderer's tokenizer."""
        return self.convo_renderer.tokenizer


class PreferenceModel:
    """Scores a comparison: `await model(comparison)` is in [-1, 1] (-1 A, 0 tie, 1 B)."""

    async def __call__(self, comparison: Comparison) -> float:
        """The preference score of `comparison`."""
        raise NotImplementedError


class PreferenceModelBuilder:
    """Makes a `PreferenceModel` when called (configuration that outlives the model)."""

    def __call__(self) -> PreferenceModel:
        """A ready preference model."""
        raise NotImplementedError


class PreferenceModelFromChatRenderer(PreferenceModel):
    """A preference model that samples one greedy token after the rendered comparison.

    The decoded, stripped token maps `"A"` → -1.0, `"B"` → 1.0, `"Tie"` → 0.0; anything else
    logs a warning and scores 0.0 (the cookbook's behaviour).

    Args:
        convo_renderer: renders the comparison (see `ComparisonRendererFromChatRenderer`).
        sampling_client: the judge model; `sample(prompt, num_samples=1,
            sampling_params=SamplingParams(temperature=0.0, max_tokens=1))` is awaited.
    """

    def __init__(self, convo_renderer: ChatRenderer, sampling_client: SamplingClient):
        self.comparison_renderer = ComparisonRendererFromChatRenderer(convo_renderer)
        self.sampling_client = sampling_client

    async def __call__(self, comparison: Comparison) -> float:
        """-1.0, 1.0 or 0.0 from the judge's one-token answer."""
        prompt = self.comparison_renderer.build_generation_prompt(comparison)
        response = await self.sampling_client.sample(
            prompt,
            num_samples=1,
            sampling_params=types.SamplingParams(temperature=0.0, max_tokens=1),
        )
        answer = str(self.comparison_renderer.tokenizer.decode(response.sequences[0].tokens))
        score = {"A": -1.0, "B": 1.0, "Tie": 0.0}.get(answer.strip())
        if score is None:
            logger.warning("Invalid output preference model output: '%s'", answer.strip())
            return 0.0
        return score


@chz.chz
class PreferenceModelBuilderFromChatRenderer(PreferenceModelBuilder):
    """Builds a `PreferenceModelFromChatRenderer` on Tinker, from names (a chz config).

    Attributes:
        renderer_name: the chat renderer (`shell.chat.get_renderer`).
        model_name: the tokenizer's model (`shell.tokenizers.get_tokenizer`).
        rm_weights_path: the judge's weights (`tinker://...`), sampled from.
        base_url: the Tinker service URL (`None`: the SDK's default).
    """

    renderer_name: str
    model_name: str
    rm_weights_path: str
    base_url: str | None = None

    def __call__(self) -> PreferenceModel:
        """The preference model, with a `tinker.ServiceClient(base_url=...)` sampling client."""
        renderer = get_renderer(self.renderer_name, get_tokenizer(self.model_name))
        sampling_client = (
            tinker.ServiceClient(base_url=self.base_url)
            .create_sampling_client(model_path=self.rm_weights_path)
            .result()
        )
        return PreferenceModelFromChatRenderer(renderer, sampling_client)
