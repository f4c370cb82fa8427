"""Training: the prefix-shared layout, the loss alignment, and end-to-end training with Trainer."""


import pytest
import torch
from transformers import TrainingArguments

from _helpers import prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.training import DartDataCollator, DartTrainer, dart_loss, evaluate_draft, prefix_shared_layout, self_distill
from dart_hf.training.trainer import draft_rows


def brute_force_layout(num_prefix, anchors, num_masks):
    rows = [("prefix", j, 0) for j in range(num_prefix)]
    rows += [("mask", b, o) for b in range(len(anchors)) for o in range(num_masks)]
    size = len(rows)
    attention = torch.zeros(size, size, dtype=torch.bool)
    positions, targets = [], []
    for r, (kind, index, offset) in enumerate(rows):
        anchor = index if kind == "prefix" else anchors[index]
        depth = 0 if kind == "prefix" else offset + 1
        positions.append(anchor + depth)
        targets.append(anchor + 2 + depth)
        for c, (other_kind, other_index, other_offset) in enumerate(rows):
            if other_kind == "prefix":
                attention[r, c] = other_index <= anchor  # every row sees its own prefix (prefix rows: causal)
            elif kind == "mask":
                attention[r, c] = other_index == index and other_offset <= offset  # causal inside its own block
    return torch.tensor(positions), torch.tensor(targets), attention


@pytest.mark.parametrize("num_prefix,anchors,num_masks", [(1, [0], 1), (5, [0, 2, 4], 3), (9, [8, 1, 3], 7), (12, [], 7)])
def test_layout_equals_brute_force(num_prefix, anchors, num_masks):
    layout = prefix_shared_layout(num_prefix, torch.tensor(anchors, dtype=torch.long), num_masks)
    positions, targets, attention = brute_force_layout(num_prefix, anchors, num_masks)
    assert torch.equal(layout.position_ids, positions)
    assert torch.equal(layout.targets, targets)
    assert torch.equal(layout.attention, attention)


def test_prefix_shared_forward_equals_one_forward_per_anchor():
    target = tiny_target("llama", dtype=torch.float64)
    draft = DartDraftModel.from_target(target, feature_norm=True)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(1, 10, 96, generator=generator, dtype=torch.float64)
    next_ids = torch.randint(0, 128, (1, 10), generator=generator)
    anchors = torch.tensor([0, 4, 9])
    layout = prefix_shared_layout(10, anchors, 7)
    with torch.no_grad():
        shared = draft(
            features, input_ids=next_ids, position_ids=layout.position_ids[None], num_masks=21,
            attention_mask=layout.additive_mask(torch.float64), logits_to_keep=0,
        ).logits[0]
        for block, anchor in enumerate(anchors.tolist()):
            alone = draft(features[:, : anchor + 1], input_ids=next_ids[:, : anchor + 1]).logits[0]  # [8, V]
            torch.testing.assert_close(shared[anchor], alone[0], rtol=0, atol=1e-10)
            torch.testing.assert_close(shared[10 + 7 * block : 10 + 7 * (block + 1)], alone[1:], rtol=0, atol=1e-10)


def make_examples(target, count, seed, tmp_path, new_tokens=48):
    return self_distill(
        target, [p[0].tolist() for p in prompts(count, seed=seed, min_len=4, max_len=12)], tmp_path / f"sd{seed}.jsonl",
        max_new_tokens=new_tokens, batch_size=16, progress=False,
    )


def test_rows_are_aligned_with_the_target_and_weighted_by_gamma(tmp_path):
    target = tiny_target("qwen3", dtype=torch.float64, seed=4)
    draft = DartDraftModel.from_target(target)
    examples = make_examples(target, 3, seed=5, tmp_path=tmp_path, new_tokens=12)
    batch = DartDataCollator()(examples)
    with torch.no_grad():
        rows = draft_rows(draft, target, batch, num_anchors=4)
    sequence = batch["input_ids"][0]
    # the target logits of a row are the target's prediction for the token the row is supervised with
    layout_targets = prefix_shared_layout(batch["input_ids"].shape[1] - 1, rows.anchors, 7).targets
    for row in torch.nonzero(rows.valid[0]).flatten().tolist():
        position = int(layout_targets[row])
        with torch.no_grad():
            expected = target(sequence[None, :position]).logits[0, -1]
        torch.testing.assert_close(rows.target_logits[0, row], expected, rtol=0, atol=1e-9)
        assert int(rows.target_tokens[0, row]) == int(sequence[position])
    # a draft that reproduces the target's distributions has zero loss; the loss weights are gamma ** depth
    valid = rows.valid
    weights = torch.where(valid, 0.6 ** rows.depths.double(), 0.0)
    assert float(dart_loss(rows.target_logits[valid], rows.target_logits[valid], weights[valid])) == pytest.approx(0, abs=1e-9)
    by_hand, anchors = 0.0, 0
    for b, r in torch.nonzero(valid).tolist():
        p = torch.log_softmax(rows.target_logits[b, r], -1)
        q = torch.log_softmax(rows.draft_logits[b, r].double(), -1)
        by_hand += 0.6 ** int(rows.depths[b, r]) * float((p.exp() * (p - q)).sum())
        anchors += int(rows.depths[b, r]) == 0
    got = float(dart_loss(rows.draft_logits[valid], rows.target_logits[valid], weights[valid]))
    assert got == pytest.approx(by_hand / anchors, rel=1e-6)


def test_training_lowers_the_loss_lifts_alpha_and_tau_and_stays_lossless(tmp_path):
    torch.manual_seed(0)
    target = tiny_target("llama", seed=7)
    train = make_examples(target, 48, seed=8, tmp_path=tmp_path)
    held_out = make_examples(target, 8, seed=9, tmp_path=tmp_path)
    draft = DartDraftModel.from_target(target, feature_norm=True)
    collator = DartDataCollator()
    before = evaluate_draft(draft, target, held_out, collator)
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, max_steps=240, learning_rate=3e-3,
        lr_scheduler_type="cosine", warmup_steps=10, max_grad_norm=0.5, logging_steps=20, save_steps=120,
        report_to=[], remove_unused_columns=False, use_cpu=True, seed=0, disable_tqdm=True,
    )
    trainer = DartTrainer(
        model=draft, args=args, train_dataset=train, data_collator=collator, target=target, anchors_per_sequence=16
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logs[-1]["loss"] < 0.6 * logs[0]["loss"]
    assert logs[-1]["train_alpha_1"] > logs[0]["train_alpha_1"]  # per-position agreement is logged as it trains
    after = evaluate_draft(draft, target, held_out, collator)
    assert after["alpha_1"] > 0.3 > 10 / 128 and after["alpha_1"] > before["alpha_1"] + 0.2
    assert after["chain_tau"] > before["chain_tau"]

    draft.eval()
    untrained = DartDraftModel.from_target(target, feature_norm=True)
    taus = {"trained": [], "untrained": []}
    for prompt in prompts(6, seed=10, min_len=4, max_len=12):
        expected = target.generate(prompt, max_new_tokens=48, do_sample=False)
        for name, candidate in (("trained", draft), ("untrained", untrained)):
            assert torch.equal(target.generate(prompt, max_new_tokens=48, assistant_model=candidate), expected)
            taus[name].append(candidate.stats.tau)
    assert sum(taus["trained"]) > sum(taus["untrained"]) * 1.2
    # checkpoints are save_pretrained folders that load as drafts
    reloaded = DartDraftModel.from_pretrained(tmp_path / "run" / "checkpoint-240", target=target)
    assert torch.equal(reloaded.lm_head.weight, draft.lm_head.weight)
