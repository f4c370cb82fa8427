"""Training a DART draft with Hugging Face `Trainer` (one CPU, DDP with torchrun, FSDP / DeepSpeed configs).

The trained model is the draft itself (a `PreTrainedModel`), so checkpoints are `save_pretrained` folders and
`resume_from_checkpoint` works as usual. The frozen target is held by the trainer and computes the features and
the soft labels online for every batch: no hidden-state dump is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, Trainer
from transformers.trainer_pt_utils import LengthGroupedSampler

from ..features import forward_with_features, takes_logits_to_keep
from ..modeling_dart import DartDraftModel
from .layout import prefix_shared_layout
from .loss import dart_loss

FLEX_MIN_HEAD_DIM = 16  # torch's compiled FlexAttention refuses smaller query / key / value heads
EVAL_LOGITS_BYTES = 2**32  # about how much of the target's row logits one evaluation batch may hold


@dataclass
class DartTrainingArguments:
    """What DART training adds to `transformers.TrainingArguments`."""

    target: str = field(metadata={"help": "target model: a Hub id or a local folder"})
    train_files: list[str] = field(
        default_factory=list,
        metadata={"help": "JSONL example files ({'prompt_ids', 'response_ids'} per line, e.g. from self-distillation)"},
    )
    existing_files: list[str] = field(
        default_factory=list,
        metadata={"help": "conversation files whose assistant replies are used as they are (teacher-labelled)"},
    )
    existing_ratio: float = field(
        default=1.0, metadata={"help": "existing-reply examples per self-distilled example (a mixing ratio)"}
    )
    eval_files: list[str] = field(default_factory=list, metadata={"help": "held-out example files for alpha/tau"})
    skip_bad_lines: bool = field(
        default=False,
        metadata={"help": "skip malformed lines of --train_files / --eval_files (printing how many) instead of "
                          "stopping at the first with an error"},
    )
    init_draft: str | None = field(default=None, metadata={"help": "start from this draft instead of a fresh one"})
    widen_mlp: int | None = field(
        default=None,
        metadata={"help": "with --init_draft: first widen its MLP to this many units, computing the same logits "
                          "(new units start with zero output weights)"},
    )
    freeze_lm_head: bool = field(
        default=False,
        metadata={"help": "with --init_draft: train everything but its output layer, which keeps its weights (a "
                          "shipped draft trained on then rewrites only its other weights' shards)"},
    )
    gamma: float = field(default=0.6, metadata={"help": "loss weight decay per predicted position (the paper's 0.6)"})
    anchors_per_sequence: int = field(
        default=32, metadata={"help": "mask blocks per sequence (sampled among response positions)"}
    )
    max_length: int = field(default=1024, metadata={"help": "longest training sequence (tokens)"})
    draft_vocab_size: int | None = field(
        default=None, metadata={"help": "reduced draft vocabulary: the most frequent response tokens"}
    )
    feature_norm: bool = field(default=True, metadata={"help": "RMSNorm each target feature layer before fc"})
    feature_dropout: float = field(default=0.0, metadata={"help": "dropout on the target features"})
    mask_rep_init_std: float = field(default=1.0, metadata={"help": "initial scale of mask_rep"})
    feature_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "cache the target's features and output-layer inputs of the training examples here once (safetensors "
            "shards, 4 * hidden_size values per token) and train from the cache: for several epochs on a small target; "
            "the held-out examples' go to its eval/ subfolder, in float32"
        },
    )
    feature_cache_dtype: str = field(default="bfloat16", metadata={"help": "dtype of the feature cache"})
    target_dtype: str = field(
        default="float32",
        metadata={
            "help": "dtype the frozen target (the teacher) runs in: 'float32', or 'bfloat16' for teacher forwards "
            "several times faster where the hardware multiplies bfloat16 natively (GPUs; CPUs with AVX512-BF16 or "
            "AMX); the draft itself trains in float32 either way"
        },
    )
    training_attention: str = field(
        default="auto",
        metadata={
            "help": "attention over the prefix-shared layout: 'flex' (torch FlexAttention block mask, compiled), "
            "'dense' (a [R, R] mask; exact, fine on CPU), or 'auto' (flex on CUDA for heads of 16 or more dimensions, "
            "dense elsewhere)"
        },
    )
    early_stopping_patience: int | None = field(
        default=None, metadata={"help": "stop after this many evaluations without a better held-out chain tau"}
    )

    def __post_init__(self):
        if self.target_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"--target_dtype must be float32, bfloat16 or float16, got {self.target_dtype!r}.")
        if self.widen_mlp and not self.init_draft:
            raise ValueError("--widen_mlp widens a trained draft: pass it with --init_draft DRAFT.")
        if self.freeze_lm_head and not self.init_draft:
            raise ValueError("--freeze_lm_head keeps a trained draft's output layer: pass it with --init_draft DRAFT "
                             "(a fresh draft's output layer is random).")


class DartTrainer(Trainer):
    """`Trainer` whose model is a DART draft bound to `target`; the loss is the prefix-shared gamma-weighted KL.

    Batches come from `DartDataCollator` (`input_ids`, `attention_mask`, `loss_mask`).
    """

    def __init__(
        self,
        *args,
        target: PreTrainedModel,
        gamma: float = 0.6,
        anchors_per_sequence: int = 32,
        training_attention: str = "auto",
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.target = target.eval().requires_grad_(False)
        self.gamma = gamma
        self.anchors_per_sequence = anchors_per_sequence
        if training_attention not in ("auto", "flex", "dense"):
            raise ValueError(f"training_attention must be 'auto', 'flex' or 'dense', got {training_attention!r}.")
        head_dim = self.accelerator.unwrap_model(self.model).config.head_dim
        if training_attention == "auto":
            use_flex = self.args.device.type == "cuda" and head_dim >= FLEX_MIN_HEAD_DIM
            training_attention = "flex" if use_flex else "dense"
        if training_attention == "flex" and head_dim < FLEX_MIN_HEAD_DIM:
            raise ValueError(
                f"FlexAttention's compiled kernels need a head dimension of at least {FLEX_MIN_HEAD_DIM}, and this "
                f"draft's is {head_dim}: train it with training_attention='dense' (exact, the same rows)."
            )
        if training_attention == "flex" and self.args.device.type == "cpu":
            raise ValueError(
                "FlexAttention has no backward pass on CPU in torch; train on CPU with training_attention='dense' "
                "(exact, the same rows) or on a GPU for 'flex'."
            )
        self.training_attention = training_attention
        self._hits = self._counts = None  # top-1 agreement per depth since the last log, for the progress logs

    def _get_train_sampler(self, train_dataset=None):
        """Length bucketing (`train_sampling_strategy="group_by_length"`) with each example's token count: batches
        of similar lengths waste less padding. Other strategies are Trainer's own."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if self.args.train_sampling_strategy == "group_by_length" and dataset is not None:
            examples = getattr(dataset, "examples", dataset)  # a CachedFeatureDataset keeps its examples
            lengths = [len(example["prompt_ids"]) + len(example["response_ids"]) for example in examples]
            batch_size = self.args.train_batch_size * self.args.gradient_accumulation_steps
            return LengthGroupedSampler(batch_size, lengths=lengths)
        return super()._get_train_sampler(train_dataset)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The prefix-shared gamma-weighted KL of one batch (and the per-depth agreement for the logs)."""
        draft = self.accelerator.unwrap_model(model)
        rows = draft_rows(
            draft, self.target, inputs, self.anchors_per_sequence, forward=model, attention=self.training_attention,
            supervised_only=True, teacher_vocab=draft_vocabulary(draft),
        )
        loss = rows_loss(rows, self.gamma)
        if model.training:
            self._count_agreement(draft, rows)
        return (loss, rows) if return_outputs else loss

    @torch.no_grad()
    def _count_agreement(self, draft: DartDraftModel, rows: "DraftRows") -> None:
        _, hits, counts = agreement(draft, rows)
        self._hits = hits if self._hits is None else self._hits + hits
        self._counts = counts if self._counts is None else self._counts + counts

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        """Add the training rows' top-1 agreement per drafted position (train_alpha_k) to the loss logs. With a
        reduced draft vocabulary the target's choice there is its top token among the draft's (the teacher's
        logits are computed for those tokens only); held-out alphas (`evaluate`) judge against its full
        vocabulary."""
        if "loss" in logs and self._counts is not None:
            for depth, (hits, count) in enumerate(zip(self._hits.tolist(), self._counts.tolist())):
                if count:
                    logs[f"train_alpha_{depth + 1}"] = round(hits / count, 4)
            self._hits = self._counts = None
        super().log(logs, *args, **kwargs)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Held-out alpha_1..alpha_8 and chain tau (`evaluate_draft`), logged with the `eval_` prefix."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        draft = self.accelerator.unwrap_model(self.model)
        metrics = evaluate_draft(draft, self.target, dataset, self.data_collator, self.args.per_device_eval_batch_size)
        metrics = {f"{metric_key_prefix}_{name}": value for name, value in metrics.items()}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


@dataclass
class DraftRows:
    """Per layout row, for a batch: draft logits `[B, R, V_d]`, the target's logits for the token the row
    predicts `[B, R, V]`, that token `[B, R]`, its depth `[B, R]` and whether it is a supervised response token;
    the anchor rows `[A]` of the mask blocks, the block size, and `anchor_share`: the share of the candidate anchors
    (positions whose next-but-one token is a response token) that got a mask block, 1 when every one did. With
    `rows` (the layout row indices `[K]`), only those rows are here (R = K): the rows some example of the batch
    supervises. With `target_vocab` (target ids `[V_t]`), the target's logits cover those tokens only, in that
    order: `[B, R, V_t]`."""

    draft_logits: torch.Tensor
    target_logits: torch.Tensor
    target_tokens: torch.Tensor
    depths: torch.Tensor
    valid: torch.Tensor
    anchors: torch.Tensor
    num_masks: int
    anchor_share: float = 1.0
    rows: torch.Tensor | None = None
    target_vocab: torch.Tensor | None = None

    def target_choice(self) -> torch.Tensor:
        """The target's top token id per row `[B, R]` (among `target_vocab` when its logits are restricted)."""
        choice = self.target_logits.argmax(dim=-1)
        return choice if self.target_vocab is None else self.target_vocab[choice]


def draft_rows(
    draft: DartDraftModel,
    target: PreTrainedModel,
    batch: dict,
    num_anchors: int | None,
    forward=None,
    attention: str = "dense",
    supervised_only: bool = False,
    teacher_vocab: torch.Tensor | None = None,
) -> "DraftRows":
    """Run the frozen target and the draft (prefix-shared layout) over a batch.

    num_anchors: mask blocks per batch, sampled among positions whose next-but-one token is a response token;
    None uses every such position. forward: the (possibly DDP-wrapped) draft to call. attention: "dense" (an
    additive `[R, R]` mask) or "flex" (a FlexAttention block mask); both compute the same rows.
    supervised_only: compute logits (the draft's and the target's) only for the rows that some example of the
    batch supervises, which is all the loss reads: prompt rows still feed the draft's attention, but skip its MLP
    and both output layers (most of a step for long prompts such as news articles).
    teacher_vocab: target ids `[V_t]` (the reduced draft vocabulary, which the loss restricts the target's
    distribution to): the target's logits are computed for these tokens only. From a feature cache its output
    layer then multiplies V_t rows of its weight instead of the whole vocabulary (151,936 for Qwen).
    """
    forward = forward if forward is not None else draft
    input_ids, attention_mask, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    seq_len = input_ids.shape[1]
    num_prefix = seq_len - 1  # prefix row j pairs h_j with the embedding of x_{j+1}
    num_masks = draft.config.draft_length - 1
    candidates = torch.nonzero(loss_mask[:, 2:].any(dim=0)).flatten()  # j with a response token at j + 2
    num_candidates = len(candidates)
    if num_anchors is not None and len(candidates) > num_anchors:
        candidates = candidates[torch.randperm(len(candidates), device=candidates.device)[:num_anchors]].sort().values
    layout = prefix_shared_layout(num_prefix, candidates.cpu(), num_masks)
    device = input_ids.device
    targets = layout.targets.to(device)  # [R], the position of the token each row predicts
    valid = (targets < seq_len) & loss_mask[:, targets.clamp(max=seq_len - 1)]  # [B, R]
    rows = valid.any(dim=0).nonzero().flatten() if supervised_only else None  # [K]
    if rows is not None:
        targets, valid = targets[rows], valid[:, rows]
    safe = targets.clamp(max=seq_len - 1)
    # the target's logits at position p label the rows that predict the token at p + 1
    label_positions, label_index = torch.unique(safe - 1, return_inverse=True)  # [P], [R or K]

    layers = list(draft.config.feature_layers)
    with torch.no_grad():
        if "target_features" in batch:  # from a feature cache: only the output layer runs
            features = batch["target_features"]
            head = target.get_output_embeddings()
            hidden = batch["target_last_hidden"][:, label_positions].to(head.weight.dtype)
            if teacher_vocab is None:
                target_logits = head(hidden)
            else:
                bias = getattr(head, "bias", None)
                target_logits = F.linear(hidden, head.weight.index_select(0, teacher_vocab),
                                         None if bias is None else bias.index_select(0, teacher_vocab))
        else:
            keep = {"logits_to_keep": label_positions} if takes_logits_to_keep(target) else {}
            outputs, features = forward_with_features(
                target, layers, input_ids=input_ids, attention_mask=attention_mask, **keep
            )
            target_logits = outputs.logits if keep else outputs.logits[:, label_positions]
            if teacher_vocab is not None:
                target_logits = target_logits.index_select(-1, teacher_vocab)

    if attention == "flex":
        mask = layout.block_mask(device)
    elif attention == "dense":
        mask = layout.additive_mask(draft.dtype).to(device)
    else:
        raise ValueError(f"attention must be 'dense' or 'flex', got {attention!r}.")
    batch_size = input_ids.shape[0]
    draft_logits = forward(
        target_hidden_states=features[:, :num_prefix],
        input_ids=input_ids[:, 1:],
        position_ids=layout.position_ids.to(device).expand(batch_size, -1),
        num_masks=len(candidates) * num_masks,
        attention_mask=mask,
        logits_to_keep=rows if rows is not None else 0,
    ).logits
    depths = layout.depths.to(device)
    return DraftRows(
        draft_logits=draft_logits,
        target_logits=target_logits[:, label_index],
        target_tokens=input_ids[:, safe],
        depths=(depths[rows] if rows is not None else depths).expand(batch_size, -1),
        valid=valid,
        anchors=candidates,
        num_masks=num_masks,
        anchor_share=len(candidates) / max(num_candidates, 1),
        rows=rows,
        target_vocab=teacher_vocab,
    )


def rows_loss(rows: DraftRows, gamma: float, draft_vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """`dart_loss` over the supervised rows of `rows`, each weighted gamma ** depth, per anchor (real row).
    draft_vocab_ids: the reduced draft vocabulary (target ids `[V_d]`) when `rows` holds the target's logits over
    its full vocabulary; rows whose target logits are already restricted to it (`draft_rows(..., teacher_vocab=...)`)
    need none.

    The objective gives every anchor a mask block. When only a sample of them got one (`rows.anchor_share` < 1),
    each mask row is weighted by the inverse share, so the loss is an unbiased estimate of that objective: weighted
    as they are, the sampled blocks alone would shrink every depth past the first by the share, against the real
    rows, which are all there."""
    depths = rows.depths.to(rows.draft_logits.dtype)
    weights = gamma**depths / torch.where(rows.depths > 0, rows.anchor_share, 1.0)
    weights = torch.where(rows.valid, weights, 0.0)
    valid = rows.valid
    num_anchors = int((valid & (rows.depths == 0)).sum())
    if rows.target_vocab is not None:
        if draft_vocab_ids is not None and not torch.equal(draft_vocab_ids, rows.target_vocab):
            raise ValueError("rows_loss: the rows' target logits cover another vocabulary than draft_vocab_ids.")
        draft_vocab_ids = None
    return dart_loss(rows.draft_logits[valid], rows.target_logits[valid], weights[valid], draft_vocab_ids,
                     num_anchors=num_anchors)


def draft_vocabulary(draft: DartDraftModel) -> torch.Tensor | None:
    """Target ids of the draft vocabulary `[V_d]` when it is reduced, else None."""
    if draft.config.draft_vocab_size == draft.config.vocab_size:
        return None
    return draft.draft_to_target(torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device))


@torch.no_grad()
def evaluate_draft(
    draft: DartDraftModel,
    target: PreTrainedModel,
    dataset,
    collator,
    batch_size: int = 8,
    max_logits_bytes: int = EVAL_LOGITS_BYTES,
) -> dict:
    """Held-out agreement of the draft with the target's greedy choice, per predicted position.

    alpha_k: top-1 accuracy at depth k - 1 (k = 1 is the first drafted token), over supervised rows.
    chain_tau: for every anchor, 1 + the number of leading depths the draft gets right (a chain drafted from the
    top-1 tokens, verified greedily), averaged: the acceptance length a one-branch tree would reach.
    Every reply token is an anchor here, so a batch holds the target's logits for up to `draft_length` rows per
    token: batches are cut to at most `batch_size` examples and about `max_logits_bytes` of those logits (one
    example at the least), which a large vocabulary (Gemma 3's 262,144 tokens) would otherwise take past memory.
    """
    was_training = draft.training
    draft.eval()
    num_depths = draft.config.draft_length
    correct = torch.zeros(num_depths)
    total = torch.zeros(num_depths)
    chain_lengths = []
    bytes_per_token = num_depths * target.config.get_text_config().vocab_size * 4
    for examples in _budgeted_batches(dataset, batch_size, max_logits_bytes // bytes_per_token):
        batch = collator(examples)
        batch = {name: tensor.to(draft.device) for name, tensor in batch.items()}
        rows = draft_rows(draft, target, batch, num_anchors=None)
        hit, batch_correct, batch_total = agreement(draft, rows)
        correct += batch_correct
        total += batch_total
        chain_lengths += chain_lengths_of(hit, rows)
    draft.train(was_training)
    metrics = {f"alpha_{depth + 1}": float(correct[depth] / total[depth].clamp(min=1)) for depth in range(num_depths)}
    metrics["chain_tau"] = float(sum(chain_lengths) / max(len(chain_lengths), 1))
    return metrics


def _budgeted_batches(dataset, batch_size: int, max_tokens: int):
    """Consecutive examples of `dataset` in lists of at most `batch_size` examples and `max_tokens` tokens (prompt
    and reply), one example at the least; read as they are yielded."""
    current, tokens = [], 0
    for index in range(len(dataset)):
        example = dataset[index]
        length = len(example["prompt_ids"]) + len(example["response_ids"])
        if current and (len(current) == batch_size or tokens + length > max_tokens):
            yield current
            current, tokens = [], 0
        current.append(example)
        tokens += length
    if current:
        yield current


def agreement(draft: DartDraftModel, rows: DraftRows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-1 agreement of the draft with the target's greedy choice: hit `[B, R]` (bool, supervised rows only),
    and per depth the hits and the supervised rows, `[draft_length]` each."""
    guess = draft.draft_to_target(rows.draft_logits.argmax(dim=-1))
    hit = (guess == rows.target_choice()) & rows.valid
    depths = torch.arange(draft.config.draft_length, device=hit.device)
    at_depth = rows.depths.unsqueeze(-1) == depths  # [B, R, D]
    correct = (hit.unsqueeze(-1) & at_depth).sum(dim=(0, 1)).float().cpu()
    total = (rows.valid.unsqueeze(-1) & at_depth).sum(dim=(0, 1)).float().cpu()
    return hit, correct, total


@torch.no_grad()
def greedy_agreement(
    draft: DartDraftModel, target: PreTrainedModel, sequence: torch.Tensor, prompt_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced agreement of the draft with a greedy continuation of the target, `sequence` `[1, S]` (the
    prompt's first `prompt_length` tokens, then vanilla `generate`'s output): per depth, the hits and the rows,
    `[draft_length]` each. On vanilla's own greedy output this is the alpha_k that DART's acceptance meets."""
    loss_mask = torch.zeros_like(sequence, dtype=torch.bool)
    loss_mask[:, prompt_length:] = True
    batch = {"input_ids": sequence, "attention_mask": torch.ones_like(sequence), "loss_mask": loss_mask}
    was_training = draft.training
    draft.eval()
    rows = draft_rows(draft, target, batch, num_anchors=None)
    draft.train(was_training)
    _, correct, total = agreement(draft, rows)
    return correct, total


def chain_lengths_of(hit: torch.Tensor, rows: DraftRows) -> list[int]:
    """For every anchor whose real row and whole mask block are supervised: 1 + its count of leading correct
    depths. hit: `[B, R]` bool, over every layout row (`draft_rows` without `supervised_only`)."""
    if rows.rows is not None:
        raise ValueError("chain_lengths_of needs every layout row: call draft_rows without supervised_only.")
    batch_size, num_blocks = hit.shape[0], len(rows.anchors)
    num_prefix = hit.shape[1] - num_blocks * rows.num_masks
    chain_hit = torch.cat(
        [hit[:, rows.anchors, None], hit[:, num_prefix:].reshape(batch_size, num_blocks, rows.num_masks)], dim=-1
    )
    chain_valid = torch.cat(
        [rows.valid[:, rows.anchors, None], rows.valid[:, num_prefix:].reshape(batch_size, num_blocks, -1)], dim=-1
    ).all(dim=-1)
    lengths = 1 + chain_hit.int().cumprod(dim=-1).sum(dim=-1)
    return lengths[chain_valid].tolist()
