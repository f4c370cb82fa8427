"""Routing `target.generate(..., assistant_model=<DART draft>)` to DART, installed on the target by `draft.bind`.

An `assistant_model` that is a `DartDraftModel` goes to `dart_generate` (through `generate`'s own preparation:
generation config, logits processors, stopping criteria, cache), or with `dart_chain=True` to Transformers' own
assisted decoding fed by `DartCandidateGenerator`; every other call goes to the model's own `generate` unchanged.
"""

from __future__ import annotations

import copy

from transformers import GenerationConfig, PreTrainedModel, StoppingCriteriaList, StopStringCriteria

from .candidates import dart_candidate_generator
from .generation import dart_generate, draft_tree_policy
from .modeling_dart import DartDraftModel
from .options import DecodingOptions


class GenerateRouter:
    """`target.generate` after `draft.bind(target)`: an `assistant_model` that is a `DartDraftModel` goes to
    `dart_generate` (through `generate`'s own preparation), or with `dart_chain=True` to Transformers' own assisted
    decoding fed by `DartCandidateGenerator`; everything else goes to the model's own `generate` unchanged.

    It holds its model by reference, as an attribute rather than a closure, so that `copy.deepcopy(model)` and
    pickling give the copy a router of the copy (a closure over the original's bound `generate` would make the copy
    generate with the original's weights). `previous` is an instance-level `generate` it replaced (None: the
    class's)."""

    def __init__(self, model: PreTrainedModel, previous=None):
        self.model = model
        self.previous = previous

    def __reduce__(self):
        return type(self), (self.model, self.previous)

    @property
    def __wrapped__(self):  # `inspect.signature` and `help` see the model's own `generate`
        return self.own_generate

    @property
    def own_generate(self):
        """The model's `generate` without DART routing, bound to the model."""
        return self.previous if self.previous is not None else type(self.model).generate.__get__(self.model)

    def __call__(self, *args, assistant_model=None, **kwargs):
        generate = self.own_generate
        if not isinstance(assistant_model, DartDraftModel):
            return generate(*args, assistant_model=assistant_model, **kwargs)
        if kwargs.get("custom_generate") is not None:
            raise ValueError("Pass either `assistant_model=<DART draft>` or `custom_generate=`, not both.")
        if kwargs.pop("dart_chain", False):  # Transformers' own assisted decoding, with DART's chain candidates
            _check_chain_options(kwargs, self.model.generation_config)
            options = DecodingOptions.resolve(assistant_model.config, kwargs.pop("tree_options", None))
            generation_config = kwargs.get("generation_config") or self.model.generation_config
            eos = kwargs.get("eos_token_id", generation_config.eos_token_id)
            policy = draft_tree_policy(assistant_model, options, eos_token_id=eos)
            with assistant_model.generating_with(self.model), dart_candidate_generator(
                self.model, assistant_model, policy
            ):
                return generate(*args, assistant_model=assistant_model, **kwargs)
        # `generate` drops `streamer` and `tokenizer` for custom functions: forward the streamer under another
        # name, and turn `stop_strings` (which needs the tokenizer) into a stopping criterion here
        streamer = kwargs.pop("streamer", None)
        _move_stop_strings_to_criteria(kwargs)
        return generate(
            *args, custom_generate=dart_generate, dart_draft=assistant_model, dart_streamer=streamer, **kwargs
        )


def install_generate_router(target: PreTrainedModel) -> None:
    """Route `target.generate(..., assistant_model=<DART draft>)` to DART (`GenerateRouter`); idempotent."""
    current = vars(target).get("generate")
    if isinstance(current, GenerateRouter) and current.model is target:
        return
    if isinstance(current, GenerateRouter):  # copied onto another instance by hand: route for this one
        current = current.previous
    target.generate = GenerateRouter(target, previous=current)


def remove_generate_router(target: PreTrainedModel) -> None:
    """Give `target` back the `generate` it had before `install_generate_router`."""
    current = vars(target).get("generate")
    if not isinstance(current, GenerateRouter):
        return
    del target.generate
    if current.previous is not None:
        target.generate = current.previous


def _check_chain_options(kwargs: dict, model_config: GenerationConfig) -> None:
    """Refuse what Transformers' assisted decoding (the `dart_chain` path) does not reproduce exactly: it checks
    stop strings and stopping criteria once per accepted chunk of tokens (a stop inside the chunk is run past), and
    it scores a whole chunk per call, which classifier-free guidance's one-token-per-call cache does not follow."""
    generation_config = kwargs.get("generation_config") or model_config
    stop_strings = kwargs.get("stop_strings", generation_config.stop_strings)
    fix = "Drop dart_chain: DART's tree decoding runs them exactly, token by token as vanilla `generate` does."
    if stop_strings or kwargs.get("stopping_criteria"):
        raise ValueError(
            "dart_chain=True runs Transformers' assisted decoding, which checks stop strings and stopping criteria "
            f"once per accepted chunk of tokens and can run past them. {fix}"
        )
    guidance_scale = kwargs.get("guidance_scale", generation_config.guidance_scale)
    if guidance_scale is not None and guidance_scale != 1:
        raise ValueError(
            "dart_chain=True runs Transformers' assisted decoding, whose chunks classifier-free guidance "
            f"(guidance_scale={guidance_scale}) does not score as vanilla `generate` does. {fix}"
        )


def _move_stop_strings_to_criteria(kwargs: dict) -> None:
    tokenizer = kwargs.pop("tokenizer", None)
    stop_strings = kwargs.pop("stop_strings", None)
    generation_config = kwargs.get("generation_config")
    if stop_strings is None and generation_config is not None and generation_config.stop_strings is not None:
        generation_config = copy.deepcopy(generation_config)
        stop_strings, generation_config.stop_strings = generation_config.stop_strings, None
        kwargs["generation_config"] = generation_config
    if stop_strings is None:
        return
    if tokenizer is None:
        raise ValueError(
            "There are one or more stop strings, either in the arguments to `generate` or in the model's generation "
            "config, but no tokenizer was passed: pass `tokenizer=tokenizer` to `generate`."
        )
    criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    kwargs["stopping_criteria"] = criteria
