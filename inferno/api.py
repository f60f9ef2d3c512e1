"""The Python API: `inferno.load()` and the `Pipeline` it returns.

    import inferno
    model = inferno.load()                      # gpt2 from the HF cache (downloaded once); or "random"
    print(model.generate("The quick brown fox", max_new_tokens=20).text)
    for piece in model.stream("Once upon a time", max_new_tokens=50, temperature=0.8, top_k=40, seed=1):
        print(piece, end="", flush=True)
    model.generate("Q: 2+2?\nA:", stop=["\n"], logprobs=5).logprobs
    model.score("The quick brown fox jumps over the lazy dog.").perplexity
    model.inspect("The quick brown fox").logit_lens[-1][-1]   # what each layer would predict, and why
    model.generate("Name and age:", json_schema={"type": "object", ...}).text   # structured output
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from inferno.backends.base import Backend
from inferno.backends.registry import get_backend
from inferno.engine import DEFAULT_PREFILL_CHUNK, DEFAULT_SLOTS, Engine, Handle
from inferno.generate import (
    GenerationError,
    GenerationResult,
    TokenStream,
    check_ids,
    generate_tokens,
    token_ids,
)
from inferno.inspect import Inspection, inspect_ids
from inferno.models.causal_lm import CausalLM, ModelConfig
from inferno.models.gpt2 import Gpt2
from inferno.options import GenerationOptions, OptionError
from inferno.scoring import ScoreResult, score_ids
from inferno.structured import CONSTRAINT_ARGUMENTS, constraint_from
from inferno.tokenizer import Tokenizer

#: A text whose ids two tokenizers must agree on for one model to draft for the other.
_PROBE = "The quick brown fox jumps over the lazy dog. 1234 éè 中文 <|endoftext|>\n\tdef f(x):"


class Pipeline:
    """A loaded model with its tokenizer: text in, text out."""

    def __init__(self, model: CausalLM, tokenizer: Tokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def backend(self) -> Backend:
        return self.model.backend

    @property
    def empty_prompt_id(self) -> int:
        """The id an empty prompt stands for (unconditional generation): the tokenizer's BOS when it has
        one (the Llama family's), else the EOS (GPT-2's ``<|endoftext|>``)."""
        bos = self.tokenizer.bos_id
        return bos if bos is not None else self.config.eos_token_id

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """The ids that end a reply: config.json's and the tokenizer's (generation_config.json's list: a
        Llama 3 Instruct reply ends at ``<|eot_id|>``, a Qwen one at ``<|im_end|>``), in that order."""
        return tuple(dict.fromkeys((*self.config.eos_token_ids, *self.tokenizer.eos_ids)))

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Prompt text or ids → ids; an empty prompt is ``[empty_prompt_id]`` (unconditional generation)."""
        # Text, or a sequence of real ints: bytes, floats, strings, None... are a PromptTypeError.
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else token_ids(prompt)
        return ids or [self.empty_prompt_id]

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Full forward pass without a cache: float32 logits [len(ids), vocab_size]."""
        ids = check_ids(ids, self.config)
        out = self.model.forward(np.asarray([ids]), all_logits=True)
        return self.backend.to_numpy(out)[0]

    @property
    def sample_limit(self) -> int:
        """Ids below this may be generated: a vocabulary padded past the tokenizer's (as some exports do)
        must not yield ids that cannot be decoded."""
        return min(self.config.vocab_size, self.tokenizer.vocab_size)

    def tokens(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 50,
        *,
        stop_at_eos: bool = True,
        options: GenerationOptions | None = None,
        speculative: str | None = None,
        draft_model: str | Pipeline | None = None,
        num_speculative_tokens: int | None = None,
        **option_kwargs,
    ) -> TokenStream:
        """A stream of new tokens: iterate it for ids, or `steps()` for ids with their text and logprobs;
        its `finish_reason` is set when it ends, and `result()` gives the `GenerationResult`.

        Options are `options` or keywords (see `GenerationOptions`): temperature=0.0 (greedy), top_k=0,
        top_p=1.0, seed=None, stop=(), stop_ids=(), repetition_penalty=1.0, presence_penalty=0.0,
        frequency_penalty=0.0, logit_bias={}, logprobs=None.

        Structured output (see `inferno.structured`; needs ``inferno-gpt2[structured]``), one of:
        ``response_format`` (``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema":
        {"schema": ...}}``, a JSON Schema or a Pydantic model class), ``json_schema`` (a JSON Schema or a
        Pydantic model class), ``regex``, ``choice`` (a list of strings), ``grammar`` (Lark), or
        ``constraint`` (an `inferno.structured.Constraint`, or what ``response_format`` takes).

        Speculative decoding (see `inferno.speculative`): ``speculative="ngram"`` (prompt lookup) or a
        `draft_model` (a name as `load` takes, loaded on this backend once, or a `Pipeline`) with this
        model's tokenizer; `num_speculative_tokens`: the first round's drafts (adaptive after).
        """
        options, stop = self._options(options, option_kwargs, stop_at_eos)
        draft = None if draft_model is None else self.draft(draft_model).model
        return generate_tokens(self.model, self.encode(prompt), max_new_tokens, options, stop,
                               self.sample_limit, self.tokenizer.incremental_decoder(),
                               speculative=speculative, draft_model=draft,
                               num_speculative_tokens=num_speculative_tokens)

    def draft(self, model: str | Pipeline) -> Pipeline:
        """A draft model for speculative decoding: loaded by name on this backend (once), or given; its
        tokenizer must be this one's (else a one-line `SpeculationError`)."""
        from inferno.speculative import SpeculationError, check_draft_model

        drafts = self.__dict__.setdefault("_drafts", {})
        if isinstance(model, Pipeline):
            pipe = model
        elif model in drafts:
            pipe = drafts[model]
        else:
            pipe = drafts[model] = load(model, self.backend)
        name = model if isinstance(model, str) else "the draft model"
        if pipe.tokenizer.vocab_size != self.tokenizer.vocab_size or \
                pipe.tokenizer.encode(_PROBE) != self.tokenizer.encode(_PROBE):
            raise SpeculationError(f"{name}'s tokenizer is not this model's: a draft model must share the "
                                   "target's tokenizer")
        check_draft_model(self.model, pipe.model, name)
        return pipe

    def _options(self, options: GenerationOptions | None, option_kwargs: dict,
                 stop_at_eos: bool) -> tuple[GenerationOptions, tuple[int, ...]]:
        """The options given as an object or as keywords (not both), and the stop ids stop_at_eos adds."""
        if options is not None and option_kwargs:
            raise OptionError(sorted(option_kwargs)[0], "cannot be given together with options=")
        asked = {k: option_kwargs.pop(k) for k in CONSTRAINT_ARGUMENTS if k in option_kwargs}
        constraint = constraint_from(**asked) if asked else None
        if constraint is not None:
            option_kwargs["constraint"] = constraint
        options = options or GenerationOptions.from_kwargs(**option_kwargs)
        return options, (self.eos_ids if stop_at_eos else ())

    def stream(self, prompt: str | Sequence[int], **kwargs) -> Iterator[str]:
        """Yield text pieces as tokens arrive (same arguments as `generate`); they join to its text.

        A multi-byte character split across tokens is held back until complete, and so is text that
        could still turn out to be the start of a stop string. Neither the stop token nor a stop string
        is yielded.
        """
        for step in self.tokens(prompt, **kwargs).steps():
            if step.text:
                yield step.text

    def generate(self, prompt: str | Sequence[int], **kwargs) -> GenerationResult:
        """Generate and return the whole result (new ids, text, finish reason, logprobs, timing).

        Keyword arguments: max_new_tokens=50, stop_at_eos=True, and the generation options (see
        `tokens`).
        """
        start = time.perf_counter()
        stream = self.tokens(prompt, **kwargs)
        for _ in stream.steps():
            pass
        return stream.result(time.perf_counter() - start)

    def engine(self, **kwargs) -> Engine:
        """A continuous-batching `Engine` on this model that decodes text and samples only ids the
        tokenizer knows (keywords: slots, max_queue, prefill_chunk, no_prefix_cache, speculative,
        draft_model (a name as `load` takes it, a `Pipeline` or a model), num_speculative_tokens; see
        `inferno.engine`)."""
        if isinstance(kwargs.get("draft_model"), str | Pipeline):
            kwargs["draft_model"] = self.draft(kwargs["draft_model"]).model
        return Engine(self.model, sample_limit=self.sample_limit, decoder=self.tokenizer.incremental_decoder,
                      **kwargs)

    def submit(self, engine: Engine, prompt: str | Sequence[int], max_new_tokens: int = 50, *,
               stop_at_eos: bool = True, options: GenerationOptions | None = None, block: bool = False,
               **option_kwargs) -> Handle:
        """Submit one prompt to `engine` with the same arguments as `generate`; returns its `Handle`."""
        options, stop = self._options(options, option_kwargs, stop_at_eos)
        return engine.submit(self.encode(prompt), max_new_tokens, options, stop_ids=stop, block=block)

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int = 50,
        *,
        per_prompt: Sequence[Mapping] | None = None,
        slots: int | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        **kwargs,
    ) -> list[GenerationResult]:
        """Generate for many prompts at once through the batching engine: one `GenerationResult` per
        prompt, in order, each what `generate` gives for it alone (up to float32 near-ties).

        Keywords as for `generate` apply to every prompt; `per_prompt` is a list of dicts, one per
        prompt, whose keys (any of `generate`'s) override them for that prompt. `slots`: sequences run
        at once (default: the number of prompts, at most 16).
        """
        if isinstance(prompts, str):
            raise GenerationError("generate_batch takes a list of prompts; for one prompt use generate")
        prompts = list(prompts)
        if per_prompt is not None and len(per_prompt) != len(prompts):
            raise GenerationError(f"per_prompt has {len(per_prompt)} entries for {len(prompts)} prompts")
        requests = [{"max_new_tokens": max_new_tokens, **kwargs, **(per_prompt[i] if per_prompt else {})}
                    for i in range(len(prompts))]
        if not prompts:
            return []
        engine = self.engine(slots=slots or min(len(prompts), DEFAULT_SLOTS), max_queue=None,
                             prefill_chunk=prefill_chunk)
        try:
            handles = [self.submit(engine, p, **r) for p, r in zip(prompts, requests, strict=True)]
            return [h.result() for h in handles]
        finally:
            engine.close()

    def score(
        self, text: str | Sequence[int], stride: int | None = None, *, top_logprobs: int = 0
    ) -> ScoreResult:
        """The log-probability of every token of `text` (text or ids) given the ones before it, and the
        perplexity. Longer texts than the context go through a sliding window (`stride`, default half
        the context; see `inferno.scoring`). `top_logprobs=N` also gives the N most likely tokens at
        each position. The text is encoded as it is (no <|endoftext|> is prepended): its first token
        has no log-probability.
        """
        ids = self.tokenizer.encode(text) if isinstance(text, str) else list(text)
        return score_ids(self.model, ids, stride, top_logprobs, self.sample_limit)


    def inspect(
        self, text_or_ids: str | Sequence[int], *, layers: Sequence[int] | int | None = None,
        heads: Sequence[int] | int | None = None, positions: Sequence[int] | int | None = None,
        top: int = 5,
    ) -> Inspection:
        """Look inside the model on `text_or_ids` (text is encoded as `generate` encodes it): the
        attention weights of every block and head, float32 ``[len(layers), len(heads), T, T]`` (rows are
        queries, columns keys), and the logit lens, ``logit_lens[layer][j]`` = the `top` most likely
        (id, probability) pairs at position ``positions[j]`` from layer 0 (the embedding) to n_layer (the
        model's own next-token distribution). `layers`, `heads` (the attention kept) and `positions`
        (where the lens is read: each costs an LM head per layer) default to all. See `inferno.inspect`.
        """
        ids = check_ids(self.encode(text_or_ids), self.config)
        result = inspect_ids(self.model, ids, layers=layers, heads=heads, positions=positions, top=top,
                             sample_limit=self.sample_limit)
        result.tokens = [self.tokenizer.decode([i]) for i in ids]
        return result


def load(
    model: str | os.PathLike | None = None,
    backend: str | Backend | None = None,
    *,
    download: bool = True,
) -> Pipeline:
    """Load a GPT-2 model by name: a local folder, a Hub repo id (``openai-community/gpt2-large``,
    ``user/fine-tune@revision``), a short name (``gpt2``, the default; ``gpt2-medium``, ``gpt2-large``,
    ``gpt2-xl``, ``distilgpt2``) or ``random`` / ``random:tiny`` (random weights built in memory, no
    download). Hub models come from the Hugging Face cache, downloaded there once (see
    `inferno.models.resolve`).

    `backend` is a registered name (default: $INFERNO_BACKEND, else "numpy"), optionally with
    options as ``"name:key=value,..."``, or a `Backend` instance.
    """
    from inferno.models.families import load_model, read_config
    from inferno.models.names import parse_model_name
    from inferno.models.resolve import resolve_model, shipped_gpt2_file

    if backend is not None and not isinstance(backend, (str, Backend)):
        raise TypeError(f"backend must be a name such as 'numpy' (optionally 'name:key=value,...'), a "
                        f"Backend instance or None, not {type(backend).__name__} ({backend!r:.40})")
    if not isinstance(download, bool):
        raise TypeError(f"download must be True or False, not {type(download).__name__}")
    spec = parse_model_name(model)
    be = backend if isinstance(backend, Backend) else get_backend(backend)
    if spec.kind == "random":
        from inferno.testing import random_weights

        config = spec.random_config
        tokenizer = Tokenizer.from_file(shipped_gpt2_file("tokenizer.json"))
        weights = random_weights(config, seed=0)
        # Each host array is let go once converted: the backend's copy and the float32 one never all coexist.
        model = Gpt2.from_weights(config, ((n, weights.pop(n)) for n in list(weights)), be)
        return Pipeline(model, tokenizer)
    files = resolve_model(spec, download=download)  # the name is parsed once, above
    _, config = read_config(files.config)  # GPT-2 or the Llama family (inferno.models.families)
    # With the folder's tokenizer_config.json, generation_config.json and config.json where there: the
    # BOS, the EOS ids and the model's chat template (inferno.tokenizer).
    tokenizer = Tokenizer.from_dir(os.path.dirname(files.tokenizer or files.vocab))
    # One tensor at a time: a backend that converts the weights (16-bit) never holds all the float32 ones.
    model = load_model(files.config, files.weights, be, config)
    return Pipeline(model, tokenizer)
